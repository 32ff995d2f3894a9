//! The canonical JSON form of component values, both ways, driven by the WIT
//! types: records are objects with kebab-case keys, a variant case without a
//! payload is `"case"` and with one `{"case": payload}`, enums are `"case"`,
//! options are `null` or the value, results `{"ok": ..}` / `{"err": ..}`, lists
//! and tuples arrays. A u64 may be given as a number or a `0x` hex string.

use serde_json::{Map, Value};
use wasmtime::component::{Type, Val};

use crate::steps::parse_u64;

fn int<T: TryFrom<i64>>(json: &Value) -> Result<T, String> {
    json.as_i64().and_then(|n| T::try_from(n).ok()).ok_or_else(|| format!("{json} is out of range"))
}

/// JSON to a value of type `ty`.
pub fn to_val(json: &Value, ty: &Type) -> Result<Val, String> {
    Ok(match ty {
        Type::Bool => Val::Bool(json.as_bool().ok_or_else(|| format!("{json} is not a boolean"))?),
        Type::U8 => Val::U8(int(json)?),
        Type::U16 => Val::U16(int(json)?),
        Type::U32 => Val::U32(int(json)?),
        Type::S32 => Val::S32(int(json)?),
        Type::S64 => Val::S64(int(json)?),
        Type::U64 => Val::U64(parse_u64(json)?),
        Type::String => Val::String(json.as_str().ok_or_else(|| format!("{json} is not a string"))?.to_string()),
        Type::List(list) => {
            let items = json.as_array().ok_or_else(|| format!("{json} is not an array"))?;
            Val::List(items.iter().map(|item| to_val(item, &list.ty())).collect::<Result<_, _>>()?)
        }
        Type::Tuple(tuple) => {
            let items = json.as_array().ok_or_else(|| format!("{json} is not an array"))?;
            if items.len() != tuple.types().len() {
                return Err(format!("{json} needs {} items", tuple.types().len()));
            }
            Val::Tuple(items.iter().zip(tuple.types()).map(|(item, ty)| to_val(item, &ty)).collect::<Result<_, _>>()?)
        }
        Type::Record(record) => {
            let object = json.as_object().ok_or_else(|| format!("{json} is not an object"))?;
            let names: Vec<&str> = record.fields().map(|f| f.name).collect();
            if let Some(unknown) = object.keys().find(|k| !names.contains(&k.as_str())) {
                return Err(format!("\"{unknown}\" is not a field of {names:?}"));
            }
            let mut fields = Vec::new();
            for field in record.fields() {
                let val = match object.get(field.name) {
                    Some(value) => to_val(value, &field.ty),
                    None => absent(&field.ty),
                };
                let val = val.map_err(|e| format!("{}: {e}", field.name))?;
                fields.push((field.name.to_string(), val));
            }
            Val::Record(fields)
        }
        Type::Variant(variant) => {
            let (name, payload) = match json {
                Value::String(name) => (name.as_str(), None),
                Value::Object(map) if map.len() == 1 => {
                    let (name, payload) = map.iter().next().ok_or("empty variant")?;
                    (name.as_str(), Some(payload))
                }
                _ => return Err(format!("{json} is not a variant case")),
            };
            let case = variant.cases().find(|c| c.name == name).ok_or_else(|| format!("\"{name}\" is not a case"))?;
            match (case.ty, payload) {
                (None, None) => Val::Variant(name.to_string(), None),
                (Some(ty), Some(payload)) => Val::Variant(name.to_string(), Some(Box::new(to_val(payload, &ty)?))),
                (None, Some(_)) => return Err(format!("case \"{name}\" takes no payload")),
                (Some(_), None) => return Err(format!("case \"{name}\" needs a payload: {{\"{name}\": ..}}")),
            }
        }
        Type::Enum(e) => {
            let name = json.as_str().ok_or_else(|| format!("{json} is not an enum case"))?;
            if !e.names().any(|n| n == name) {
                return Err(format!("\"{name}\" is not a case"));
            }
            Val::Enum(name.to_string())
        }
        Type::Option(option) => match json {
            Value::Null => Val::Option(None),
            value => Val::Option(Some(Box::new(to_val(value, &option.ty())?))),
        },
        other => return Err(format!("the runner does not convert {other:?}")),
    })
}

/// The value of an omitted record field: none, an empty list, an empty string
/// or false. Any other omitted field is an error.
fn absent(ty: &Type) -> Result<Val, String> {
    Ok(match ty {
        Type::Option(_) => Val::Option(None),
        Type::List(_) => Val::List(Vec::new()),
        Type::String => Val::String(String::new()),
        Type::Bool => Val::Bool(false),
        _ => return Err("is required".to_string()),
    })
}

/// A value to JSON.
pub fn to_json(val: &Val) -> Value {
    match val {
        Val::Bool(b) => Value::from(*b),
        Val::U8(n) => Value::from(*n),
        Val::U16(n) => Value::from(*n),
        Val::U32(n) => Value::from(*n),
        Val::U64(n) => Value::from(*n),
        Val::S32(n) => Value::from(*n),
        Val::S64(n) => Value::from(*n),
        Val::String(s) => Value::from(s.as_str()),
        Val::List(items) | Val::Tuple(items) => Value::Array(items.iter().map(to_json).collect()),
        Val::Record(fields) => Value::Object(fields.iter().map(|(k, v)| (k.clone(), to_json(v))).collect::<Map<_, _>>()),
        Val::Variant(name, None) | Val::Enum(name) => Value::from(name.as_str()),
        Val::Variant(name, Some(payload)) => {
            let mut map = Map::new();
            map.insert(name.clone(), to_json(payload));
            Value::Object(map)
        }
        Val::Option(None) => Value::Null,
        Val::Option(Some(v)) => to_json(v),
        Val::Result(result) => {
            let (key, payload) = match result {
                Ok(v) => ("ok", v),
                Err(e) => ("err", e),
            };
            let mut map = Map::new();
            map.insert(key.to_string(), payload.as_deref().map_or(Value::Null, to_json));
            Value::Object(map)
        }
        other => Value::from(format!("<{other:?}>")),
    }
}

//! The stdio form's framing, in front of rmcp: each line the client writes is
//! checked before rmcp reads it.
//!
//! - A line over `max-message-bytes` is not kept (memory stays bounded by the
//!   limit): the client gets a JSON-RPC error `-32600` naming both sizes, with
//!   the request's id when it could be read from the line's start.
//! - A line that is not JSON gets `-32700` (parse error, id null), as JSON-RPC
//!   2.0 asks; JSON that is not a message of MCP (a batch, params of the wrong
//!   shape) gets `-32600` with its id. rmcp alone drops the first two silently
//!   and answers the last without an id: the client's request would wait forever.
//! - The client's answer to a request of the server's that cannot be read fails
//!   that request, in the client's name ([`Refused::Answer`]).
//!
//! Well-formed messages go to rmcp unchanged. Every line written to the client
//! (rmcp's and these errors) is written whole, one at a time; the errors wait
//! for the client to read them, and the client's input waits for the errors.

use rmcp::model::ClientJsonRpcMessage;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, DuplexStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// How much of an oversized line is kept to find its id.
const ID_SCAN_BYTES: usize = 4096;

/// Starts the framing between `input`/`output` (the client) and the stream
/// it returns (for rmcp). Ends when the client closes `input` (rmcp then
/// reads the end, and `client_gone` is cancelled at once: rmcp's service
/// waits for its requests in flight, which must be cancelled, not awaited)
/// and rmcp closes its side.
pub fn frame<R, W>(input: R, output: W, max_message_bytes: usize, client_gone: CancellationToken) -> DuplexStream
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (ours, theirs) = tokio::io::duplex(1 << 16);
    let (from_rmcp, mut to_rmcp) = tokio::io::split(ours);
    // Bounded: a client that sends bad lines faster than it reads the errors
    // is read no faster than the errors are written (memory stays flat).
    let (errors, mut error_lines) = mpsc::channel::<String>(64);
    tokio::spawn(async move {
        let mut input = BufReader::new(input);
        let mut line = Vec::new();
        loop {
            match read_line_capped(&mut input, &mut line, max_message_bytes).await {
                Ok(Line::End) | Err(_) => break,
                Ok(Line::Oversized(size)) => {
                    let mut head = top_level_head(&line[..line.len().min(ID_SCAN_BYTES)]);
                    if head.id.is_none() {
                        head.id = trailing_id(&line[line.len().saturating_sub(TAIL_BYTES)..]);
                    }
                    let message = format!(
                        "agent-retry proxy: the message is {size} bytes, over the limit of {max_message_bytes} bytes (max-message-bytes); it was not read"
                    );
                    let refused = match head.id {
                        Some(id) if head.answer && !head.method => Refused::Answer { id, message },
                        id => Refused::Request { id: id.unwrap_or_else(|| "null".into()), code: -32600, message },
                    };
                    if !deliver(Some(refused), &errors, &mut to_rmcp).await {
                        break;
                    }
                }
                Ok(Line::Whole) => {
                    if line.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    if let Some(refused) = refusal(&line) {
                        if !deliver(Some(refused), &errors, &mut to_rmcp).await {
                            break;
                        }
                        continue;
                    }
                    line.push(b'\n');
                    if to_rmcp.write_all(&line).await.is_err() {
                        break;
                    }
                }
            }
        }
        client_gone.cancel();
        let _ = to_rmcp.shutdown().await;
    });
    tokio::spawn(async move {
        let mut output = output;
        let mut from_rmcp = BufReader::new(from_rmcp);
        let mut line = Vec::new();
        let mut rmcp_open = true;
        // `read_until` keeps what it read when the other branch wins: the
        // line is cleared only once it was written whole.
        loop {
            let next = tokio::select! {
                read = from_rmcp.read_until(b'\n', &mut line), if rmcp_open => match read {
                    Ok(0) | Err(_) => { rmcp_open = false; continue; }
                    Ok(_) => None,
                },
                error = error_lines.recv() => match error {
                    Some(error) => Some(error),
                    None if rmcp_open => continue,
                    None => break,
                },
                else => break,
            };
            let written = match next {
                Some(error) => output.write_all(error.as_bytes()).await,
                None => {
                    let written = output.write_all(&line).await;
                    line.clear();
                    written
                }
            };
            if written.is_err() || output.flush().await.is_err() {
                break;
            }
        }
    });
    theirs
}

/// A client's message refused before rmcp reads it.
pub enum Refused {
    /// A request (or anything not an answer): the client gets this error, with
    /// the request's id (as JSON text) or `null`.
    Request { id: String, code: i32, message: String },
    /// The client's answer to a request of the server's that cannot be read:
    /// the server's request is answered with this error in the client's name
    /// (the client's own pending requests are left alone: their ids are
    /// another numbering).
    Answer { id: String, message: String },
}

/// Why a client's message is refused before rmcp reads it, if it is. Not JSON
/// is `-32700` (id null); JSON that is not a message of the protocol is
/// `-32600` with the request's id (rmcp alone answers it without one, and the
/// client's request would wait forever); a batch is `-32600` (MCP has none
/// since 2025-06-18). A message without an id and a method goes on: rmcp
/// ignores the notifications it does not know. An answer without an id is
/// refused too (id null): nothing can be failed by it.
pub fn refusal(message: &[u8]) -> Option<Refused> {
    let error = serde_json::from_slice::<ClientJsonRpcMessage>(message).err()?;
    let value: serde_json::Value = match serde_json::from_slice(message) {
        Ok(value) => value,
        Err(e) => return Some(Refused::Request { id: "null".into(), code: -32700, message: format!("agent-retry proxy: the message is not JSON: {e}") }),
    };
    let Some(object) = value.as_object() else {
        let what = if value.is_array() { "a batch (MCP has none)" } else { "not a JSON-RPC message" };
        return Some(Refused::Request { id: "null".into(), code: -32600, message: format!("agent-retry proxy: {what}") });
    };
    let id = object.get("id").filter(|id| id.is_string() || id.is_number()).map(serde_json::Value::to_string);
    let message = format!("agent-retry proxy: not a JSON-RPC message of MCP: {error}");
    if !object.contains_key("method")
        && (object.contains_key("result") || object.contains_key("error"))
        && let Some(id) = id
    {
        return Some(Refused::Answer { id, message });
    }
    if object.contains_key("method") && !object.contains_key("id") {
        // A notification rmcp does not know: it ignores it, as it should.
        return None;
    }
    // JSON-RPC 2.0: an id that cannot be read is answered as null.
    Some(Refused::Request { id: id.unwrap_or_else(|| "null".into()), code: -32600, message })
}

/// Sends a refusal where it goes: the client's error to the client, an
/// unreadable answer to rmcp as the client's error answer. False once rmcp is gone.
async fn deliver(refused: Option<Refused>, errors: &mpsc::Sender<String>, to_rmcp: &mut (impl AsyncWrite + Unpin)) -> bool {
    match refused {
        Some(Refused::Request { id, code, message }) => {
            let _ = errors.send(error_line(&id, code, &message)).await;
            true
        }
        Some(Refused::Answer { id, message }) => to_rmcp.write_all(error_line(&id, -32600, &message).as_bytes()).await.is_ok(),
        None => true,
    }
}

fn error_line(id: &str, code: i32, message: &str) -> String {
    format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"error\":{{\"code\":{code},\"message\":{}}}}}\n", serde_json::Value::from(message))
}

enum Line {
    /// A whole line is in the buffer (without its newline).
    Whole,
    /// The line had this many bytes, over the limit; the buffer keeps its
    /// start ([`ID_SCAN_BYTES`]) and then its last [`TAIL_BYTES`].
    Oversized(usize),
    End,
}

/// How much of an oversized line's end is kept: the TypeScript SDK writes a
/// message's `id` last.
const TAIL_BYTES: usize = 256;

/// Reads one line into `line`, keeping at most `max` bytes of it (and only
/// [`ID_SCAN_BYTES`] once it is known to be over).
async fn read_line_capped<R: AsyncBufRead + Unpin>(input: &mut R, line: &mut Vec<u8>, max: usize) -> std::io::Result<Line> {
    line.clear();
    let (mut size, mut over) = (0usize, false);
    loop {
        let available = input.fill_buf().await?;
        if available.is_empty() {
            return Ok(match (size, over) {
                (0, _) => Line::End,
                (_, true) => Line::Oversized(size),
                (_, false) => Line::Whole,
            });
        }
        let (chunk, done) = match available.iter().position(|b| *b == b'\n') {
            Some(at) => (&available[..at], Some(at + 1)),
            None => (available, None),
        };
        size += chunk.len();
        if !over && size > max {
            over = true;
            line.truncate(ID_SCAN_BYTES);
        }
        if over {
            // The start up to ID_SCAN_BYTES, then a window of the last TAIL_BYTES.
            line.extend_from_slice(chunk);
            if line.len() > ID_SCAN_BYTES + TAIL_BYTES {
                line.drain(ID_SCAN_BYTES..line.len() - TAIL_BYTES);
            }
        } else {
            line.extend_from_slice(chunk);
        }
        let consumed = done.unwrap_or(available.len());
        input.consume(consumed);
        if done.is_some() {
            return Ok(if over { Line::Oversized(size) } else { Line::Whole });
        }
    }
}

/// What the start of a message says of itself: its top-level `id` (as JSON
/// text, if it is there and whole: a number or a string), and whether it has a
/// top-level `method` (a request or notification) or `result`/`error` (an
/// answer). A member inside `params` is not the message's.
#[derive(Default)]
struct Head {
    id: Option<String>,
    method: bool,
    answer: bool,
}

fn top_level_head(text: &[u8]) -> Head {
    let mut head = Head::default();
    let mut depth = 0u32;
    let mut i = 0;
    let mut expecting_key = false;
    while i < text.len() {
        match text[i] {
            b'{' => {
                depth += 1;
                expecting_key = depth == 1;
            }
            b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            b',' if depth == 1 => expecting_key = true,
            b'"' => {
                let Some(end) = string_end(text, i) else { return head };
                if depth == 1 && expecting_key {
                    match &text[i..=end] {
                        b"\"id\"" => head.id = value_after_colon(text, end + 1),
                        b"\"method\"" => head.method = true,
                        b"\"result\"" | b"\"error\"" => head.answer = true,
                        _ => {}
                    }
                }
                expecting_key = false;
                i = end;
            }
            _ => {}
        }
        i += 1;
    }
    head
}

/// The top-level `id` a message ends with, as JSON text: `,"id":VALUE}` (or
/// `"id": "text"`) closing the message with one brace, a number or a string.
/// Two braces would close an object inside it, whose `id` is not the message's.
fn trailing_id(tail: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(tail).ok().or_else(|| {
        // A cut UTF-8 character at the window's start: skip to a boundary.
        (1..4).find_map(|skip| std::str::from_utf8(tail.get(skip..)?).ok())
    })?;
    let body = text.trim_end().strip_suffix('}')?.trim_end();
    let (before, value) = if let Some(quoted) = body.strip_suffix('"') {
        let open = quoted.rfind('"')?;
        (&body[..open], &body[open..])
    } else {
        let start = body.rfind(|c: char| !(c.is_ascii_digit() || "-+.eE".contains(c)))? + 1;
        (&body[..start], &body[start..])
    };
    let before = before.trim_end().strip_suffix(':')?.trim_end().strip_suffix("\"id\"")?.trim_end();
    if !(before.ends_with(',') || before.ends_with('{')) {
        return None;
    }
    let parsed: serde_json::Value = serde_json::from_str(value).ok()?;
    (parsed.is_number() || parsed.is_string()).then(|| parsed.to_string())
}

/// The index of the quote that closes the string opening at `start`.
fn string_end(text: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    while i < text.len() {
        match text[i] {
            b'\\' => i += 2,
            b'"' => return Some(i),
            _ => i += 1,
        }
    }
    None
}

/// A number or string value after `: ` at `from`, as JSON text.
fn value_after_colon(text: &[u8], from: usize) -> Option<String> {
    let rest = &text[from..];
    let colon = rest.iter().position(|b| !b.is_ascii_whitespace())?;
    if rest[colon] != b':' {
        return None;
    }
    let start = from + colon + 1 + rest[colon + 1..].iter().position(|b| !b.is_ascii_whitespace())?;
    let end = match text[start] {
        b'"' => string_end(text, start)? + 1,
        b'-' | b'0'..=b'9' => start + text[start..].iter().position(|b| !(b.is_ascii_digit() || b"-+.eE".contains(b))).unwrap_or(text.len() - start),
        _ => return None,
    };
    // Whole only if something follows it (the line was cut after it).
    if end >= text.len() {
        return None;
    }
    let value = std::str::from_utf8(&text[start..end]).ok()?;
    serde_json::from_str::<serde_json::Value>(value).ok().filter(|v| v.is_string() || v.is_number()).map(|v| v.to_string())
}

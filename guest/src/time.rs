//! Calendar arithmetic for absolute-time hints (HTTP-date, RFC 3339) and for
//! saying when a quota resets. Times are ms since the Unix epoch, UTC.

use alloc::string::String;

use crate::cat::{ZeroPadded, cat};

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
pub fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day number from `days_from_civil`.
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        4 | 6 | 9 | 11 => 30,
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        _ => 31,
    }
}

/// Ms since the epoch of a validated UTC date and time; `None` if any part is out
/// of range or the time is before 1970.
pub fn epoch_ms(year: i64, month: u32, day: u32, hour: u32, minute: u32, second: u32, milli: u32) -> Option<u64> {
    let valid = (1970..=9999).contains(&year)
        && (1..=12).contains(&month)
        && day >= 1
        && day <= days_in_month(year, month)
        && hour < 24
        && minute < 60
        && second <= 60 // a leap second is read as the next second
        && milli < 1000;
    if !valid {
        return None;
    }
    let days = days_from_civil(year, month, day) as u64;
    let seconds = days * 86_400 + u64::from(hour) * 3600 + u64::from(minute) * 60 + u64::from(second);
    Some(seconds * 1000 + u64::from(milli))
}

/// RFC 3339 UTC text (`2026-11-30T14:00:00Z`) for a time in ms; whole seconds.
pub fn format_rfc3339(ms: u64) -> String {
    let seconds = ms / 1000;
    let (year, month, day) = civil_from_days((seconds / 86_400) as i64);
    let rest = seconds % 86_400;
    let two = |n: u64| ZeroPadded(n, 2);
    cat!(ZeroPadded(year as u64, 4), "-", two(month.into()), "-", two(day.into()), "T", two(rest / 3600), ":", two(rest / 60 % 60), ":", two(rest % 60), "Z")
}

const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

fn month_number(name: &str) -> Option<u32> {
    MONTHS.iter().position(|m| *m == name).map(|i| i as u32 + 1)
}

fn digits<T: core::str::FromStr>(text: &str, len: usize) -> Option<T> {
    if text.len() == len && text.bytes().all(|b| b.is_ascii_digit()) { text.parse().ok() } else { None }
}

fn hms(text: &str) -> Option<(u32, u32, u32)> {
    let mut parts = text.split(':');
    let h = digits(parts.next()?, 2)?;
    let m = digits(parts.next()?, 2)?;
    let s = digits(parts.next()?, 2)?;
    if parts.next().is_some() { None } else { Some((h, m, s)) }
}

/// An HTTP-date (RFC 9110 §5.6.7) in any of its three forms, in ms since the epoch:
/// IMF-fixdate `Sun, 06 Nov 1994 08:49:37 GMT`, obsolete RFC 850
/// `Sunday, 06-Nov-94 08:49:37 GMT` and asctime `Sun Nov  6 08:49:37 1994`.
/// Like Python's `email.utils.parsedate_to_datetime` (which the OpenAI and
/// Anthropic SDKs use), the IMF form may say `UTC`, `UT` or `+0000` for `GMT`,
/// have a one-digit day, or leave out the weekday.
pub fn parse_http_date(text: &str) -> Option<u64> {
    let words: alloc::vec::Vec<&str> = text.split_ascii_whitespace().take(7).collect();
    let utc = |zone: &str| matches!(zone, "GMT" | "UTC" | "UT" | "Z" | "+0000" | "-0000");
    let day_of_month = |day: &str| -> Option<u32> { if day.len() == 1 { digits(day, 1) } else { digits(day, 2) } };
    match words.as_slice() {
        // IMF-fixdate, with or without the weekday
        [weekday, day, month, year, time, zone] if weekday.ends_with(',') && weekday.len() == 4 && utc(zone) => {
            let (h, m, s) = hms(time)?;
            epoch_ms(digits(year, 4)?, month_number(month)?, day_of_month(day)?, h, m, s, 0)
        }
        [day, month, year, time, zone] if utc(zone) && day.len() <= 2 => {
            let (h, m, s) = hms(time)?;
            epoch_ms(digits(year, 4)?, month_number(month)?, day_of_month(day)?, h, m, s, 0)
        }
        // RFC 850: two-digit year, read as 1970..2069.
        [weekday, date, time, "GMT"] if weekday.ends_with(',') => {
            let mut parts = date.split('-');
            let day = digits(parts.next()?, 2)?;
            let month = month_number(parts.next()?)?;
            let yy: i64 = digits(parts.next()?, 2)?;
            if parts.next().is_some() {
                return None;
            }
            let year = if yy < 70 { 2000 + yy } else { 1900 + yy };
            let (h, m, s) = hms(time)?;
            epoch_ms(year, month, day, h, m, s, 0)
        }
        // asctime: the day may be one digit (space-padded).
        [weekday, month, day, time, year] if weekday.len() == 3 => {
            let day: u32 = if day.len() == 1 { digits(day, 1)? } else { digits(day, 2)? };
            let (h, m, s) = hms(time)?;
            epoch_ms(digits(year, 4)?, month_number(month)?, day, h, m, s, 0)
        }
        _ => None,
    }
}

/// An RFC 3339 date-time (`2026-11-30T14:00:00Z`, `...T14:00:00.5+05:30`) in ms
/// since the epoch. Fractions finer than a millisecond are rounded up.
pub fn parse_rfc3339(text: &str) -> Option<u64> {
    let bytes = text.as_bytes();
    if bytes.len() < 20 || !matches!(bytes[10], b'T' | b't' | b' ') {
        return None;
    }
    let date = text.get(..10)?;
    let year: i64 = digits(date.get(..4)?, 4)?;
    let month: u32 = digits(date.get(5..7)?, 2)?;
    let day: u32 = digits(date.get(8..10)?, 2)?;
    if bytes[4] != b'-' || bytes[7] != b'-' {
        return None;
    }
    let (h, m, s) = hms(text.get(11..19)?)?;
    let mut rest = text.get(19..)?;
    let mut nanos: u64 = 0;
    if let Some(fraction) = rest.strip_prefix('.') {
        let len = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if len == 0 || len > 9 {
            return None;
        }
        let (digits, after) = fraction.split_at_checked(len)?;
        nanos = digits.parse::<u64>().ok()? * 10u64.pow(9 - len as u32);
        rest = after;
    }
    let offset_minutes: i64 = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let (oh, om) = rest.get(1..)?.split_once(':')?;
            let oh: i64 = digits(oh, 2)?;
            let om: i64 = digits(om, 2)?;
            if oh > 23 || om > 59 {
                return None;
            }
            sign * (oh * 60 + om)
        }
    };
    let local = epoch_ms(year, month, day, h, m, s, 0)? as i64 + nanos.div_ceil(1_000_000) as i64;
    let utc = local - offset_minutes * 60_000;
    u64::try_from(utc).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOV_6_1994: u64 = 784_111_777_000;

    #[test]
    fn http_date_forms_agree() {
        assert_eq!(parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"), Some(NOV_6_1994));
        assert_eq!(parse_http_date("Sunday, 06-Nov-94 08:49:37 GMT"), Some(NOV_6_1994));
        assert_eq!(parse_http_date("Sun Nov  6 08:49:37 1994"), Some(NOV_6_1994));
        assert_eq!(parse_http_date("Sun, 31 Feb 1994 08:49:37 GMT"), None);
        assert_eq!(parse_http_date("Sun, 06 Nov 1994 08:49:37 PST"), None);
        assert_eq!(parse_http_date("Sun, 6 Nov 1994 08:49:37 UTC"), Some(NOV_6_1994));
        assert_eq!(parse_http_date("06 Nov 1994 08:49:37 +0000"), Some(NOV_6_1994));
        assert_eq!(parse_http_date("tomorrow"), None);
        assert_eq!(parse_http_date(""), None);
    }

    #[test]
    fn rfc3339_offsets_and_fractions() {
        assert_eq!(parse_rfc3339("1994-11-06T08:49:37Z"), Some(NOV_6_1994));
        assert_eq!(parse_rfc3339("1994-11-06T14:19:37+05:30"), Some(NOV_6_1994));
        assert_eq!(parse_rfc3339("1994-11-06T08:49:37.0001Z"), Some(NOV_6_1994 + 1));
        assert_eq!(parse_rfc3339("1994-11-06T08:49:37.250Z"), Some(NOV_6_1994 + 250));
        assert_eq!(parse_rfc3339("1994-11-06"), None);
        assert_eq!(parse_rfc3339("1994-13-06T08:49:37Z"), None);
        assert_eq!(parse_rfc3339("1994-11-06T08:49:37é"), None);
    }

    #[test]
    fn format_and_calendar_round_trip() {
        assert_eq!(format_rfc3339(NOV_6_1994), "1994-11-06T08:49:37Z");
        for days in [-1000i64, 0, 59, 60, 11_016, 20_000, 2_932_896] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }
}

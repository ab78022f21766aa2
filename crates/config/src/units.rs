//! Durations (`1s`, `500ms`) and sizes (`64KiB`) as written in the config.

use std::time::Duration;

/// Parses `250us`, `500ms`, `1s`, `1.5s`, `2m`, `1h`, and `0`. A unit is required, written against the
/// number (as Envoy, Go and Kubernetes want): `15` could mean seconds or milliseconds, and `1 s` reads
/// like a typo.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().map_err(|_| {
        format!(
            "`{text}` is not a duration: expected a number and a unit, such as `1s`, `500ms`, `2m`"
        )
    })?;
    let seconds = match unit.trim_start() {
        "" => {
            return Err(format!(
                "`{text}` has no unit: write `{text}s` for seconds or `{text}ms` for milliseconds"
            ))
        }
        known @ ("s" | "ms" | "us" | "µs" | "m" | "h") if unit.starts_with(char::is_whitespace) => {
            return Err(format!(
                "`{text}`: write the unit against the number, as `{number}{known}`"
            ))
        }
        "s" => value,
        "ms" => value / 1e3,
        "us" | "µs" => value / 1e6,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        other => {
            return Err(format!(
                "`{text}` has unknown unit `{other}`: expected one of us, ms, s, m, h"
            ))
        }
    };
    if !seconds.is_finite() || seconds > 1e9 {
        return Err(format!("`{text}` is out of range"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// A duration as the file would write it: `1h`, `30s`, `250ms`.
pub(crate) fn format_duration(duration: Duration) -> String {
    let seconds = duration.as_secs();
    if duration.subsec_nanos() == 0 && seconds >= 3600 && seconds.is_multiple_of(3600) {
        format!("{}h", seconds / 3600)
    } else if duration.subsec_nanos() == 0 {
        format!("{seconds}s")
    } else {
        format!("{}ms", duration.as_millis())
    }
}

/// Parses `65536`, `64KiB`, `64k`, `1MiB`, `2MB`.
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: u64 = number.parse().map_err(|_| {
        format!(
            "`{text}` is not a size: expected bytes, or a number with KiB or MiB, such as `64KiB`"
        )
    })?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        other => {
            return Err(format!(
                "`{text}` has unknown unit `{other}`: expected KiB, MiB, KB or MB"
            ))
        }
    };
    value
        .checked_mul(scale)
        .ok_or_else(|| format!("`{text}` is out of range"))
}

/// Parses a rate in bytes per second: `1KiB/s`, `500/s`, or `0` (off). The `/s` is required on any
/// other value, as a duration's unit is: `1KiB` alone could be per second or per minute.
pub(crate) fn parse_rate(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(0);
    }
    match text.strip_suffix("/s") {
        Some(size) => parse_size(size).map_err(|e| e.replacen("size", "rate", 1)),
        None if parse_size(text).is_ok() => Err(format!(
            "`{text}` has no time unit: write `{text}/s` for bytes per second"
        )),
        None => Err(format!(
            "`{text}` is not a rate: expected a size per second, such as `1KiB/s`, or 0 for off"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("15")
            .expect_err("no unit")
            .contains("write `15s` for seconds or `15ms`"));
        assert!(parse_duration("1 s")
            .expect_err("a space")
            .contains("as `1s`"));
        assert!(parse_duration("5x")
            .expect_err("bad unit")
            .contains("unknown unit `x`"));
        assert!(parse_duration("fast").is_err());
    }

    #[test]
    fn durations_are_written_back_as_the_file_would() {
        assert_eq!(format_duration(Duration::from_secs(3600)), "1h");
        assert_eq!(format_duration(Duration::from_secs(75)), "75s");
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64KiB"), Ok(65_536));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("100"), Ok(100));
        assert!(parse_size("12 parsecs").is_err());
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("1KiB/s"), Ok(1024));
        assert_eq!(parse_rate("500/s"), Ok(500));
        assert_eq!(parse_rate(" 0 "), Ok(0));
        assert_eq!(parse_rate("0/s"), Ok(0));
        assert_eq!(
            parse_rate("1KiB"),
            Err("`1KiB` has no time unit: write `1KiB/s` for bytes per second".to_owned())
        );
        assert_eq!(
            parse_rate("fast"),
            Err(
                "`fast` is not a rate: expected a size per second, such as `1KiB/s`, or 0 for off"
                    .to_owned()
            )
        );
        assert!(parse_rate("1 parsec/s")
            .expect_err("bad unit")
            .contains("unknown unit `parsec`"));
    }
}

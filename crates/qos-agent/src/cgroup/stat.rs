//! Pure, allocation-free parsers of the counter files: v1 `blkio.*io_service_bytes*` and v2 `io.stat`.
//!
//! Both sum over devices with saturating arithmetic: a total that would exceed `u64::MAX` stays there rather than
//! wrapping (which would look like a reset) or panicking.

use std::path::Path;

use qos_core::IoCounters;

use super::error::{CgroupError, Result};

/// Parses the v1 blkio "rwstat" format of `blkio.bfq.io_service_bytes_recursive` and
/// `blkio.throttle.io_service_bytes_recursive`:
///
/// ```text
/// 7:0 Read 67108864
/// 7:0 Write 0
/// 7:0 Sync 67108864
/// 7:0 Async 0
/// 7:0 Discard 0
/// 7:0 Total 67108864
/// Total 67108864
/// ```
///
/// Sums `Read` and `Write` over devices. `Sync`/`Async` split the same bytes again, `Total` sums them, so those
/// (and `Discard`, and operations a future kernel might add) are checked for form but not counted. The final
/// `Total` line may be missing; an empty file is zero.
///
/// `file` only names the file in errors. Public so that the parsers can be fuzzed (`tests/fuzz_parsers.rs`); the
/// agent itself reads through [`super::CounterReader`].
pub fn parse_blkio_stat(file: &Path, bytes: &[u8]) -> Result<IoCounters> {
    let mut counters = IoCounters::default();
    for (index, line) in bytes.split(|b| *b == b'\n').enumerate() {
        let err = |reason: &str| CgroupError::parse(file, index + 1, line, reason);
        let mut fields = line.split(u8::is_ascii_whitespace).filter(|f| !f.is_empty());
        let (first, second, third, extra) = (fields.next(), fields.next(), fields.next(), fields.next());
        match (first, second, third, extra) {
            (None, ..) => {}
            (Some(b"Total"), Some(value), None, None) => {
                parse_u64(value).ok_or_else(|| err("bad Total value"))?;
            }
            (Some(device), Some(op), Some(value), None) => {
                if !is_device(device) {
                    return Err(err("expected MAJ:MIN"));
                }
                let value = parse_u64(value).ok_or_else(|| err("bad byte count"))?;
                match op {
                    b"Read" => counters.read = counters.read.saturating_add(value),
                    b"Write" => counters.write = counters.write.saturating_add(value),
                    _ if op.iter().all(u8::is_ascii_alphabetic) => {}
                    _ => return Err(err("bad operation name")),
                }
            }
            _ => return Err(err("expected \"MAJ:MIN OP BYTES\" or \"Total BYTES\"")),
        }
    }
    Ok(counters)
}

/// Parses v2 `io.stat`: one line per device, `8:16 rbytes=1 wbytes=2 rios=3 wios=4 dbytes=0 dios=0`, plus
/// whatever keys other controllers add (`cost.usage=…`, `depth=max`, …), which are ignored whatever their value.
/// Sums `rbytes` and `wbytes` over devices; an empty file is zero. `file` only names the file in errors.
pub fn parse_io_stat(file: &Path, bytes: &[u8]) -> Result<IoCounters> {
    let mut counters = IoCounters::default();
    for (index, line) in bytes.split(|b| *b == b'\n').enumerate() {
        let err = |reason: &str| CgroupError::parse(file, index + 1, line, reason);
        let mut fields = line.split(u8::is_ascii_whitespace).filter(|f| !f.is_empty());
        let Some(device) = fields.next() else { continue };
        if !is_device(device) {
            return Err(err("expected MAJ:MIN"));
        }
        for field in fields {
            let Some(eq) = field.iter().position(|b| *b == b'=') else {
                return Err(err("expected KEY=VALUE"));
            };
            let (key, value) = (&field[..eq], &field[eq + 1..]);
            if key.is_empty() {
                return Err(err("empty key"));
            }
            let slot = match key {
                b"rbytes" => &mut counters.read,
                b"wbytes" => &mut counters.write,
                _ => continue,
            };
            let value = parse_u64(value).ok_or_else(|| err("bad byte count"))?;
            *slot = slot.saturating_add(value);
        }
    }
    Ok(counters)
}

/// `MAJ:MIN`, both decimal.
fn is_device(field: &[u8]) -> bool {
    let Some(colon) = field.iter().position(|b| *b == b':') else { return false };
    let (major, minor) = (&field[..colon], &field[colon + 1..]);
    let decimal = |s: &[u8]| !s.is_empty() && s.len() <= 10 && s.iter().all(u8::is_ascii_digit);
    decimal(major) && decimal(minor)
}

/// A decimal u64 without sign; `None` for anything else, including values above `u64::MAX`.
fn parse_u64(field: &[u8]) -> Option<u64> {
    if field.is_empty() || !field.iter().all(u8::is_ascii_digit) {
        return None;
    }
    field.iter().try_fold(0u64, |acc, d| acc.checked_mul(10)?.checked_add(u64::from(d - b'0')))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v1(text: &[u8]) -> Result<IoCounters> {
        parse_blkio_stat(Path::new("blkio.bfq.io_service_bytes_recursive"), text)
    }

    fn v2(text: &[u8]) -> Result<IoCounters> {
        parse_io_stat(Path::new("io.stat"), text)
    }

    /// Verbatim from this kernel after a 64 MiB O_DIRECT read on loop0 (7:0) with BFQ.
    const REAL_V1: &[u8] = b"7:0 Read 67108864\n7:0 Write 0\n7:0 Sync 67108864\n7:0 Async 0\n7:0 Discard 0\n\
7:0 Total 67108864\nTotal 67108864\n";

    #[test]
    fn v1_real_file() {
        assert_eq!(v1(REAL_V1).unwrap(), IoCounters::new(64 << 20, 0));
        assert_eq!(v1(b"Total 0\n").unwrap(), IoCounters::default());
    }

    #[test]
    fn v1_sums_devices_without_double_counting() {
        let text = b"8:0 Read 100\n8:0 Write 10\n8:0 Sync 60\n8:0 Async 50\n8:0 Discard 7\n8:0 Total 110\n\
8:16 Read 1\n8:16 Write 2\n8:16 Sync 3\n8:16 Async 0\n8:16 Discard 0\n8:16 Total 3\nTotal 113\n";
        assert_eq!(v1(text).unwrap(), IoCounters::new(101, 12));
    }

    #[test]
    fn v1_tolerates_empty_missing_total_trailing_space_and_new_ops() {
        assert_eq!(v1(b"").unwrap(), IoCounters::default());
        assert_eq!(v1(b"\n\n").unwrap(), IoCounters::default());
        assert_eq!(v1(b"8:0 Read 5\n8:0 Write 6").unwrap(), IoCounters::new(5, 6));
        assert_eq!(v1(b"8:0 Read 5   \n  8:0\tWrite 6 \nTotal 11  \n").unwrap(), IoCounters::new(5, 6));
        assert_eq!(v1(b"8:0 Read 5\n8:0 Zoned 9\n").unwrap(), IoCounters::new(5, 0));
    }

    #[test]
    fn v1_saturates_near_u64_max() {
        let text = format!("8:0 Read {}\n8:16 Read 2\n8:0 Write {}\n", u64::MAX - 1, u64::MAX);
        assert_eq!(v1(text.as_bytes()).unwrap(), IoCounters::new(u64::MAX, u64::MAX));
        let too_big = b"8:0 Read 18446744073709551616\n";
        assert!(matches!(v1(too_big).unwrap_err(), CgroupError::Parse { line: 1, .. }));
    }

    #[test]
    fn v1_garbage_names_file_line_and_text() {
        let err = v1(b"8:0 Read 1\n8:0 Read -1\n").unwrap_err();
        match &err {
            CgroupError::Parse { file, line, text, .. } => {
                assert_eq!(file, Path::new("blkio.bfq.io_service_bytes_recursive"));
                assert_eq!(*line, 2);
                assert_eq!(text, "8:0 Read -1");
            }
            other => panic!("{other}"),
        }
        assert!(err.to_string().contains("blkio.bfq.io_service_bytes_recursive:2"), "{err}");
        for bad in [&b"8:0 Read\n"[..], b"Read 8:0 1\n", b"8:0 Read 1 2\n", b"Total\n", b"Total x\n", b"x:0 Read 1\n"] {
            assert!(v1(bad).is_err(), "{:?} accepted", String::from_utf8_lossy(bad));
        }
        assert!(v1(b"8:0 Re@d 1\n").is_err());
    }

    #[test]
    fn v1_non_utf8_is_a_parse_error_with_lossy_text() {
        let err = v1(b"8:0 Read \xff\xfe\n").unwrap_err();
        assert!(matches!(err, CgroupError::Parse { line: 1, ref text, .. } if text.contains('\u{fffd}')), "{err}");
    }

    #[test]
    fn v2_sums_bytes_and_ignores_other_keys() {
        let text = b"8:16 rbytes=1 wbytes=2 rios=3 wios=4 dbytes=0 dios=0\n\
253:0 rbytes=10 wbytes=20 rios=1 wios=1 dbytes=5 dios=1 cost.vrate=135.00 depth=max avg_lat=7 win=x\n";
        assert_eq!(v2(text).unwrap(), IoCounters::new(11, 22));
    }

    #[test]
    fn v2_tolerant_cases() {
        assert_eq!(v2(b"").unwrap(), IoCounters::default());
        assert_eq!(v2(b"8:0 rbytes=5   \n\n").unwrap(), IoCounters::new(5, 0));
        assert_eq!(v2(b"8:0\n").unwrap(), IoCounters::default());
        let text = format!("8:0 rbytes={m} wbytes={m}\n8:16 rbytes=1 wbytes=1\n", m = u64::MAX);
        assert_eq!(v2(text.as_bytes()).unwrap(), IoCounters::new(u64::MAX, u64::MAX));
    }

    #[test]
    fn v2_garbage() {
        for (bad, line) in [
            (&b"rbytes=1\n"[..], 1),
            (b"8:0 rbytes=1\n8:16 rbytes\n", 2),
            (b"8:0 rbytes=x\n", 1),
            (b"8:0 wbytes=\n", 1),
            (b"8:0 =5\n", 1),
            (b"8:0 rbytes=-1\n", 1),
            (b"8:0 rbytes=18446744073709551616\n", 1),
            (b"8:0 rbytes=\xff\n", 1),
        ] {
            match v2(bad) {
                Err(CgroupError::Parse { line: l, file, .. }) => {
                    assert_eq!(l, line, "{:?}", String::from_utf8_lossy(bad));
                    assert_eq!(file, Path::new("io.stat"));
                }
                other => panic!("{:?} gave {other:?}", String::from_utf8_lossy(bad)),
            }
        }
    }

    #[test]
    fn u64_edges() {
        assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_u64(b"018"), Some(18));
        assert_eq!(parse_u64(b"+1"), None);
        assert_eq!(parse_u64(b""), None);
        assert!(is_device(b"259:12"));
        assert!(!is_device(b"259:"));
        assert!(!is_device(b":1"));
        assert!(!is_device(b"1:2:3"));
    }
}

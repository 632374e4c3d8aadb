//! Numbers in blueprints, never truncated: whole numbers range-checked into `i32` (replicas,
//! ports, CPUs), TOSCA `scalar-unit.size` values (`4 GB`, `512 MiB`) turned into
//! Kubernetes quantities; each refusal names the property's path.

use serde_yaml_ng::Value;

use super::ToscaError;

/// A whole number in `min..=max`. Accepts a YAML integer or a string of one (`"8080"`);
/// refuses fractions, other types and anything out of range (never wraps or truncates).
pub fn int_in(v: &Value, path: &str, min: i32, max: i32) -> Result<i32, ToscaError> {
    let n: i128 = match v {
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => i128::from(i),
            (None, Some(u)) => i128::from(u),
            _ => return Err(ToscaError::invalid(path, format!("expected a whole number, got {n}"))),
        },
        Value::String(s) => s.trim().parse::<i128>().map_err(|_| ToscaError::invalid(path, format!("expected a whole number, got {s:?}")))?,
        _ => return Err(ToscaError::invalid(path, "expected a whole number")),
    };
    i32::try_from(n)
        .ok()
        .filter(|x| (min..=max).contains(x))
        .ok_or_else(|| ToscaError::OutOfRange { path: path.to_owned(), value: n.to_string(), min: min.into(), max: max.into() })
}

/// The Kubernetes suffix of a TOSCA Simple Profile 1.3 `scalar-unit.size` unit (3.3.6.4:
/// B, kB, KiB, MB, MiB, GB, GiB, TB, TiB; unit names are case-insensitive).
fn size_suffix(unit: &str) -> Option<&'static str> {
    Some(match unit.to_ascii_lowercase().as_str() {
        "b" => "",
        "kb" => "k",
        "kib" => "Ki",
        "mb" => "M",
        "mib" => "Mi",
        "gb" => "G",
        "gib" => "Gi",
        "tb" => "T",
        "tib" => "Ti",
        _ => return None,
    })
}

/// Largest memory quantity accepted, in bytes (Kubernetes keeps quantities as int64).
const MAX_BYTES: f64 = i64::MAX as f64;

/// A `scalar-unit.size` (`4 GB`, `1.5GiB`, `512 mib`: a number, optional spaces, a unit)
/// as a Kubernetes quantity with the same value (`4G`, `1.5Gi`, `512Mi`) and its bytes. At
/// least one byte, at most `i64::MAX` bytes; a missing or unknown unit is refused (the spec
/// makes a missing unit an error).
pub fn size(v: &Value, path: &str) -> Result<(String, f64), ToscaError> {
    let s = match v {
        Value::String(s) => s.trim(),
        Value::Number(n) => return Err(ToscaError::invalid(path, format!("{n} has no unit: a scalar-unit.size needs one of B, kB, KiB, MB, MiB, GB, GiB, TB, TiB"))),
        _ => return Err(ToscaError::invalid(path, "expected a size such as 4 GB or 512 MiB")),
    };
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (scalar, unit) = (&s[..split], s[split..].trim());
    let well_formed = !scalar.is_empty() && !scalar.starts_with('.') && !scalar.ends_with('.') && scalar.matches('.').count() <= 1;
    if !well_formed {
        return Err(ToscaError::invalid(path, format!("{s:?} is not a size: expected a number then a unit, e.g. 4 GB")));
    }
    let suffix = size_suffix(unit)
        .ok_or_else(|| ToscaError::invalid(path, format!("{s:?}: unknown or missing unit {unit:?}; expected one of B, kB, KiB, MB, MiB, GB, GiB, TB, TiB")))?;
    let quantity = format!("{scalar}{suffix}");
    let bytes = ferry_kube::quantity::parse(&quantity).map_err(|e| ToscaError::invalid(path, e.to_string()))?;
    if !(1.0..=MAX_BYTES).contains(&bytes) {
        return Err(ToscaError::OutOfRange { path: path.to_owned(), value: s.to_owned(), min: 1, max: i128::from(i64::MAX) });
    }
    Ok((quantity, bytes))
}

/// Most CPUs a `num_cpus` may ask for (TOSCA's `num_cpus` is an integer ≥ 1).
pub const MAX_CPUS: i32 = i32::MAX;

/// `num_cpus` (a whole number of CPUs, at least 1) as a CPU quantity and its count.
pub fn cpus(v: &Value, path: &str) -> Result<(String, f64), ToscaError> {
    let n = int_in(v, path, 1, MAX_CPUS)?;
    Ok((n.to_string(), f64::from(n)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn y(s: &str) -> Value {
        serde_yaml_ng::from_str(s).unwrap()
    }

    #[test]
    fn sizes_follow_the_simple_profile_units_case_insensitively() {
        for (given, quantity, bytes) in [
            ("4 GB", "4G", 4e9),
            ("4GB", "4G", 4e9),
            ("4 gb", "4G", 4e9),
            ("2 GiB", "2Gi", 2.0 * 1073741824.0),
            ("512 MiB", "512Mi", 512.0 * 1048576.0),
            ("512 mib", "512Mi", 512.0 * 1048576.0),
            ("1.5 GiB", "1.5Gi", 1.5 * 1073741824.0),
            ("100 MB", "100M", 1e8),
            ("1 kB", "1k", 1e3),
            ("1 KB", "1k", 1e3),
            ("1 KiB", "1Ki", 1024.0),
            ("1 TB", "1T", 1e12),
            ("1 TiB", "1Ti", 1099511627776.0),
            ("4096 B", "4096", 4096.0),
        ] {
            let (q, b) = size(&Value::String(given.into()), "p").unwrap();
            assert_eq!((q.as_str(), b), (quantity, bytes), "{given}");
        }
    }

    #[test]
    fn bad_sizes_name_the_path() {
        for (given, want) in [("4", "has no unit"), ("4 XB", "unknown or missing unit \"XB\""), ("GB", "is not a size"), ("0 GB", "out of range"), ("99999999999 TiB", "out of range"), ("1.2.3 GB", "is not a size")] {
            let v = if given == "4" { y("4") } else { Value::String(given.into()) };
            let e = size(&v, "node_templates.h.node_filter.properties[1].mem_size").unwrap_err().to_string();
            assert!(e.starts_with("node_templates.h.node_filter.properties[1].mem_size: ") && e.contains(want), "{given}: {e}");
        }
    }

    #[test]
    fn whole_numbers_are_range_checked_never_truncated() {
        assert_eq!(int_in(&y("4"), "p", 1, 1000).unwrap(), 4);
        assert_eq!(int_in(&y("\"8080\""), "p", 1, 65535).unwrap(), 8080);
        for (v, want) in [("4294967297", "4294967297 is out of range 1 to 1000"), ("0", "out of range"), ("-3", "out of range"), ("18446744073709551615", "out of range"), ("2.5", "expected a whole number"), ("[1]", "expected a whole number")] {
            let e = int_in(&y(v), "node_templates.web.properties.replicas", 1, 1000).unwrap_err().to_string();
            assert!(e.starts_with("node_templates.web.properties.replicas: ") && e.contains(want), "{v}: {e}");
        }
        assert_eq!(cpus(&y("2"), "p").unwrap().0, "2");
        assert!(cpus(&y("0"), "p").is_err());
    }
}

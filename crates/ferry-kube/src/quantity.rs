//! Resource quantities (`100m`, `1.5Gi`, `2e3`, `1k`...) parsed as Kubernetes parses them,
//! through `kube_quantity`: every suffix and exponent, never by stripping letters.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube_quantity::ParsedQuantity;

/// A quantity that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a Kubernetes quantity: {reason}")]
pub struct QuantityError {
    /// The text.
    pub value: String,
    /// What the parser said.
    pub reason: String,
}

/// The quantity's value in base units (cores for CPU, bytes for memory).
pub fn parse(q: &str) -> Result<f64, QuantityError> {
    let err = |reason: String| QuantityError { value: q.to_owned(), reason };
    // kube_quantity takes a bare suffix ("Mi") as zero; Kubernetes requires a number.
    if !q.trim().starts_with(|c: char| c.is_ascii_digit() || matches!(c, '+' | '-' | '.')) {
        return Err(err("a quantity starts with a number".into()));
    }
    let parsed: ParsedQuantity = Quantity(q.trim().to_owned()).try_into().map_err(|e| err(format!("{e}")))?;
    parsed.to_bytes_f64().ok_or_else(|| err("out of range".into()))
}

/// CPU in millicores (rounded up, as the scheduler rounds requests).
pub fn millicores(q: &str) -> Result<i64, QuantityError> {
    Ok((parse(q)? * 1000.0).ceil() as i64)
}

/// Memory (or any count) in whole units, rounded up.
pub fn units(q: &str) -> Result<i64, QuantityError> {
    Ok(parse(q)?.ceil() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_suffix_and_exponent() {
        for (q, cores) in [("1", 1.0), ("100m", 0.1), ("1500m", 1.5), ("0.5", 0.5), ("2e3", 2000.0), ("1k", 1000.0), ("250u", 0.00025)] {
            assert!((parse(q).unwrap() - cores).abs() < 1e-9, "{q}");
        }
        for (q, bytes) in [("1Ki", 1024), ("1Mi", 1 << 20), ("1.5Gi", 3 << 29), ("1G", 1_000_000_000), ("128974848", 128_974_848), ("129e6", 129_000_000), ("1Ti", 1 << 40)] {
            assert_eq!(units(q).unwrap(), bytes, "{q}");
        }
        assert_eq!(millicores("100m").unwrap(), 100);
        assert_eq!(millicores("0.1").unwrap(), 100);
        assert_eq!(millicores("1.0001").unwrap(), 1001);
    }

    #[test]
    fn rejects_what_kubernetes_rejects() {
        for q in ["", "abc", "1Qi", "1 Mi", "Mi"] {
            assert!(parse(q).is_err(), "{q:?} should not parse");
        }
    }
}

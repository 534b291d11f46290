//! Numbers as people and Kubernetes write them, read without overflow.
//!
//! - Kubernetes quantities (`nvidia.com/gpu: "2"`, `memory: 480Gi`, `1k`): parsed with
//!   `kube_quantity`, whose own integer conversions multiply without a check, so only its
//!   floating-point value is used here and every range is checked before a number leaves.
//! - Model sizes as users say them (`8B`, `1.5B`, `350M`, `70e9`, or a plain count):
//!   [`ParameterCount`].

use std::fmt;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The most GPUs one container, pod or node is believed to have: far above any machine, low
/// enough that sums of a few thousand stay exact and small.
pub const MAX_GPUS: u64 = 1 << 16;
/// The most bytes of memory a quantity is believed to state (1 EiB).
pub const MAX_BYTES: u64 = 1 << 60;
/// The largest model the hints accept (10^15 parameters, far above any trained model).
pub const MAX_PARAMETERS: u64 = 1_000_000_000_000_000;

/// A quantity that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Not a Kubernetes quantity at all.
    #[error("{0:?} is not a Kubernetes quantity")]
    NotAQuantity(String),
    /// Negative.
    #[error("{0:?} is negative")]
    Negative(String),
    /// A count (GPUs) that is not a whole number.
    #[error("{0:?} is not a whole number")]
    NotWhole(String),
    /// Larger than anything real.
    #[error("{value:?} is larger than {limit}, more than any machine has")]
    TooLarge {
        /// The quantity as written.
        value: String,
        /// The largest accepted value.
        limit: u64,
    },
}

fn value_of(q: &Quantity) -> Result<f64, QuantityError> {
    let text = q.0.trim();
    let value = match kube_quantity::ParsedQuantity::try_from(text) {
        Ok(parsed) => parsed.to_bytes_f64(),
        // Two valid forms kube_quantity 0.9 does not read: the exa binary suffix (`2Ei`) and
        // numbers beyond its decimal range (`1e30`). Both are read here as floats.
        Err(_) => match text.strip_suffix("Ei") {
            Some(number) => number.parse::<f64>().ok().map(|v| v * (1u64 << 60) as f64),
            None => text.parse::<f64>().ok(),
        },
    }
    .filter(|v| v.is_finite())
    .ok_or_else(|| QuantityError::NotAQuantity(text.to_string()))?;
    if value < 0.0 {
        return Err(QuantityError::Negative(text.to_string()));
    }
    Ok(value)
}

fn bounded(q: &Quantity, value: f64, limit: u64) -> Result<u64, QuantityError> {
    // `limit` is at most 2^60, exactly representable; anything at or below it converts exactly
    // enough for a byte count and without overflow.
    #[allow(clippy::cast_precision_loss)]
    if value > limit as f64 {
        return Err(QuantityError::TooLarge {
            value: q.0.clone(),
            limit,
        });
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(value.ceil() as u64)
}

/// A count of devices (`nvidia.com/gpu`): a whole, non-negative number of at most [`MAX_GPUS`].
pub fn device_count(q: &Quantity) -> Result<u64, QuantityError> {
    let value = value_of(q)?;
    if value.fract() != 0.0 {
        return Err(QuantityError::NotWhole(q.0.clone()));
    }
    bounded(q, value, MAX_GPUS)
}

/// A memory size in bytes (rounded up), at most [`MAX_BYTES`].
pub fn bytes(q: &Quantity) -> Result<u64, QuantityError> {
    let value = value_of(q)?;
    bounded(q, value, MAX_BYTES)
}

/// The most CPU cores a quantity is believed to state.
pub const MAX_CPU_CORES: u64 = 1 << 20;

/// CPU cores (`2`, `500m`, `1.5`): a non-negative number of at most [`MAX_CPU_CORES`], in cores.
pub fn cpu_cores(q: &Quantity) -> Result<f64, QuantityError> {
    let value = value_of(q)?;
    bounded(q, value, MAX_CPU_CORES)?;
    Ok(value)
}

/// Total trainable parameters of a model, written as users say it: a plain count
/// (`8000000000`), or a decimal with a suffix — `K` thousand, `M` million, `B` billion,
/// `T` trillion, either case — or an exponent (`8B`, `1.5b`, `350M`, `70e9`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ParameterCount(u64);

impl ParameterCount {
    /// The pattern the CRD schema checks strings against.
    pub const PATTERN: &'static str = r"^[0-9]+(\.[0-9]+)?([eE][0-9]{1,2}|[kKmMbBtT])?$";

    /// A count, if it is within 1 ..= [`MAX_PARAMETERS`].
    pub fn new(count: u64) -> Result<Self, String> {
        if count == 0 {
            return Err("model.parameters must be at least 1".to_string());
        }
        if count > MAX_PARAMETERS {
            return Err(format!(
                "model.parameters {count} is more than {MAX_PARAMETERS} (10^15), larger than any model: give the model's total parameter count, e.g. 8B"
            ));
        }
        Ok(ParameterCount(count))
    }

    /// The count.
    pub fn get(self) -> u64 {
        self.0
    }

    /// Reads `8B`, `1.5b`, `350M`, `70e9` or `8000000000`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim();
        let bad = || {
            format!(
                "model.parameters {text:?} is not a parameter count: write it as a number (8000000000) or with K, M, B or T (8B, 1.5B, 350M)"
            )
        };
        if t.is_empty() || t.len() > 32 {
            return Err(bad());
        }
        let (number, scale) = match t.char_indices().last() {
            Some((i, c)) if c.is_ascii_alphabetic() && !matches!(c, 'e' | 'E') => {
                let scale = match c.to_ascii_uppercase() {
                    'K' => 1e3,
                    'M' => 1e6,
                    'B' => 1e9,
                    'T' => 1e12,
                    _ => return Err(bad()),
                };
                (&t[..i], scale)
            }
            _ => (t, 1.0),
        };
        if number.is_empty()
            || !number
                .chars()
                .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E'))
        {
            return Err(bad());
        }
        let value: f64 = number.parse().map_err(|_| bad())?;
        let count = value * scale;
        if !count.is_finite() {
            return Err(bad());
        }
        #[allow(clippy::cast_precision_loss)]
        if count > MAX_PARAMETERS as f64 {
            return Err(format!(
                "model.parameters {text:?} is more than 10^15, larger than any model: give the model's total parameter count, e.g. 8B"
            ));
        }
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        ParameterCount::new(count.round() as u64)
    }
}

impl fmt::Display for ParameterCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        #[allow(clippy::cast_precision_loss)]
        let v = self.0 as f64;
        match self.0 {
            n if n >= 1_000_000_000_000 => write!(f, "{:.3}T", v / 1e12),
            n if n >= 1_000_000_000 => write!(f, "{:.2}B", v / 1e9),
            n if n >= 1_000_000 => write!(f, "{:.1}M", v / 1e6),
            n => write!(f, "{n}"),
        }
    }
}

impl Serialize for ParameterCount {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for ParameterCount {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Float(f64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => ParameterCount::new(n),
            Raw::Float(v) if v.is_finite() && v >= 1.0 && v.fract() == 0.0 => {
                ParameterCount::parse(&format!("{v:e}"))
            }
            Raw::Float(v) => Err(format!(
                "model.parameters {v} is not a parameter count: use a whole number of at least 1"
            )),
            Raw::Text(t) => ParameterCount::parse(&t),
        }
        .map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for ParameterCount {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ParameterCount".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        // Int-or-string, like a resource quantity: the pattern checks strings, the range checks
        // integers; the operator checks the range of strings (8B) itself.
        schemars::json_schema!({
            "x-kubernetes-int-or-string": true,
            "pattern": ParameterCount::PATTERN,
            "minimum": 1,
            "maximum": MAX_PARAMETERS,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity(s.to_string())
    }

    #[test]
    fn device_counts_are_whole_bounded_and_never_overflow() {
        assert_eq!(device_count(&q("2")), Ok(2));
        assert_eq!(device_count(&q("1k")), Ok(1000));
        assert_eq!(device_count(&q("0")), Ok(0));
        for bad in ["18446744073709551615", "1e30", "70000", "2Ei"] {
            assert!(
                matches!(device_count(&q(bad)), Err(QuantityError::TooLarge { .. })),
                "{bad}: {:?}",
                device_count(&q(bad))
            );
        }
        assert!(matches!(
            device_count(&q("0.5")),
            Err(QuantityError::NotWhole(_))
        ));
        assert!(matches!(
            device_count(&q("-1")),
            Err(QuantityError::Negative(_))
        ));
        for junk in ["", "two", "1x", "nan", "inf", "1e999"] {
            assert!(device_count(&q(junk)).is_err(), "{junk}");
        }
    }

    #[test]
    fn cpu_cores_read_cores_and_millicores() {
        let q = |s: &str| Quantity(s.into());
        assert_eq!(cpu_cores(&q("2")), Ok(2.0));
        assert_eq!(cpu_cores(&q("500m")), Ok(0.5));
        assert_eq!(cpu_cores(&q("1.5")), Ok(1.5));
        assert!(cpu_cores(&q("-1")).is_err());
        assert!(cpu_cores(&q("1e30")).is_err());
        assert!(cpu_cores(&q("two")).is_err());
    }

    #[test]
    fn memory_sizes_read_every_suffix() {
        assert_eq!(bytes(&q("480Gi")), Ok(480 << 30));
        assert_eq!(bytes(&q("64Mi")), Ok(64 << 20));
        assert_eq!(bytes(&q("1G")), Ok(1_000_000_000));
        assert_eq!(bytes(&q("1.5Gi")), Ok(3 << 29));
        assert!(matches!(
            bytes(&q("16Ei")),
            Err(QuantityError::TooLarge { .. })
        ));
    }

    #[test]
    fn parameters_read_as_users_say_them() {
        for (text, want) in [
            ("8B", 8_000_000_000),
            ("1.5b", 1_500_000_000),
            ("350M", 350_000_000),
            ("70e9", 70_000_000_000),
            ("8000000000", 8_000_000_000),
            ("1T", 1_000_000_000_000),
            ("7k", 7_000),
        ] {
            assert_eq!(
                ParameterCount::parse(text).map(|p| p.get()),
                Ok(want),
                "{text}"
            );
        }
        for bad in [
            "", "0", "0B", "-8B", "8X", "eight", "1e30", "B", "8 B", "1e999", "8BB",
        ] {
            assert!(ParameterCount::parse(bad).is_err(), "{bad}");
        }
        let from_json: ParameterCount = serde_json::from_str("\"8B\"").unwrap();
        assert_eq!(from_json.get(), 8_000_000_000);
        let from_int: ParameterCount = serde_json::from_str("1100000000").unwrap();
        assert_eq!(from_int.to_string(), "1.10B");
        for bad in ["0", "-3", "1e30", "2.5", "\"1e30\"", "null"] {
            assert!(
                serde_json::from_str::<ParameterCount>(bad).is_err(),
                "{bad}"
            );
        }
        assert_eq!(serde_json::to_string(&from_json).unwrap(), "8000000000");
    }
}

//! Value types shared by `TrainingJob` and `OffloadProfile`.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// How optimizer state (and optionally parameters) leaves GPU memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ModeSetting {
    /// Decide from the node class: coherent unified memory gets `UnifiedMemory`, every other
    /// GPU node `CPUCopy`.
    #[default]
    Auto,
    /// Keep offloaded state resident in the CPU half of a hardware-coherent (ATS over
    /// NVLink-C2C) address space; only valid on coherent nodes.
    UnifiedMemory,
    /// Copy offloaded state to isolated host memory and back (classic PCIe offload).
    #[serde(rename = "CPUCopy")]
    CpuCopy,
    /// No offload.
    Disabled,
}

/// Whether the CPU optimizer update runs overlapped with GPU work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum OverlapSetting {
    /// On only where the node's self-test verified overlap at or above the profile's
    /// `minOverlapEfficiency`.
    #[default]
    Auto,
    /// On, whatever the self-test says.
    Enabled,
    /// Off.
    Disabled,
}

/// A boolean switch that may also be left to the operator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Switch {
    /// Let the operator decide.
    #[default]
    Auto,
    /// On.
    Enabled,
    /// Off.
    Disabled,
}

/// The concrete offload mode a job runs with, once resolved.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
pub enum OffloadMode {
    /// Unified-memory residency on a coherent node.
    UnifiedMemory,
    /// Explicit copy to isolated host memory.
    #[serde(rename = "CPUCopy")]
    CpuCopy,
    /// No offload.
    Disabled,
}

impl OffloadMode {
    /// The value written to `OFFLOAD_MODE`.
    pub fn env_value(self) -> &'static str {
        match self {
            OffloadMode::UnifiedMemory => "unified-memory",
            OffloadMode::CpuCopy => "cpu-copy",
            OffloadMode::Disabled => "disabled",
        }
    }

    /// The spec value that states this concrete mode.
    pub fn as_setting(self) -> ModeSetting {
        match self {
            OffloadMode::UnifiedMemory => ModeSetting::UnifiedMemory,
            OffloadMode::CpuCopy => ModeSetting::CpuCopy,
            OffloadMode::Disabled => ModeSetting::Disabled,
        }
    }
}

impl fmt::Display for OffloadMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OffloadMode::UnifiedMemory => "UnifiedMemory",
            OffloadMode::CpuCopy => "CPUCopy",
            OffloadMode::Disabled => "Disabled",
        })
    }
}

/// The class of node a configuration is made for; a job spans exactly one class.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
pub enum NodeClass {
    /// Hardware-coherent unified memory: NVML addressing mode ATS and NVLink-C2C enabled
    /// (GH200 and other superchips).
    Coherent,
    /// Every other GPU node: PCIe-attached GPUs, with or without HMM page migration.
    Discrete,
}

impl fmt::Display for NodeClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NodeClass::Coherent => "Coherent",
            NodeClass::Discrete => "Discrete",
        })
    }
}

/// Share of optimizer state to offload: `Auto`, a number in (0, 1], or `None` where nothing is
/// offloaded (what the operator writes for a job it decides `Disabled`).
///
/// In the API it is a string: `Auto`, `None` or a decimal such as `"0.9"` (quoted in YAML).
/// Reading also accepts a bare number, for configuration files.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum RatioSetting {
    /// Let the operator pick the share the CPU can update within the GPU's backward time.
    #[default]
    Auto,
    /// A fixed share in (0, 1].
    Fixed(f64),
    /// Nothing offloaded (only with mode `Disabled`).
    None,
}

impl RatioSetting {
    /// The CEL rule the CRD schema uses to check a ratio value.
    pub const CEL_RULE: &'static str =
        "self == 'Auto' || self == 'None' || (double(self) > 0.0 && double(self) <= 1.0)";
    /// The pattern the CRD schema uses: `Auto`, `None` or a plain decimal.
    pub const PATTERN: &'static str = r"^(Auto|None|[0-9]*\.?[0-9]+)$";

    /// Whether a fixed value lies in (0, 1].
    pub fn is_valid_ratio(value: f64) -> bool {
        value.is_finite() && value > 0.0 && value <= 1.0
    }
}

impl fmt::Display for RatioSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RatioSetting::Auto => f.write_str("Auto"),
            RatioSetting::Fixed(v) => write!(f, "{v}"),
            RatioSetting::None => f.write_str("None"),
        }
    }
}

impl Serialize for RatioSetting {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Always a string in the API (see the schema below); `Display` gives `1` or `0.9`.
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for RatioSetting {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(f64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Number(v) if RatioSetting::is_valid_ratio(v) => Ok(RatioSetting::Fixed(v)),
            Raw::Number(v) => Err(serde::de::Error::custom(format!(
                "offloadRatio {v} is out of range: use a number greater than 0 and at most 1, or Auto"
            ))),
            Raw::Text(t) if t == "Auto" => Ok(RatioSetting::Auto),
            Raw::Text(t) if t == "None" => Ok(RatioSetting::None),
            Raw::Text(t) => match t.parse::<f64>() {
                Ok(v) if RatioSetting::is_valid_ratio(v) => Ok(RatioSetting::Fixed(v)),
                _ => Err(serde::de::Error::custom(format!(
                    "offloadRatio {t:?} is not valid: use Auto, None (nothing offloaded, with mode Disabled) or a number greater than 0 and at most 1"
                ))),
            },
        }
    }
}

impl JsonSchema for RatioSetting {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "RatioSetting".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        // A structural schema cannot say "the string Auto or a number" (only int-or-string is
        // special-cased, and CEL cannot type an untyped field), so the ratio is a string
        // holding `Auto`, `None` or a decimal; the pattern and the CEL rule check it.
        schemars::json_schema!({
            "type": "string",
            "pattern": RatioSetting::PATTERN,
            "x-kubernetes-validations": [{
                "rule": RatioSetting::CEL_RULE,
                "message": "offloadRatio must be Auto, None (nothing offloaded, with mode Disabled) or a number greater than 0 and at most 1, written as a string (e.g. \"0.9\")"
            }]
        })
    }
}

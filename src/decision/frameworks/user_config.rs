//! The user's DeepSpeed config, read once for every caller of the decision: parsed, with what
//! the decision needs from it (the ZeRO stage, a ZenFlow section, and what sizes memory).

use serde_json::Value;

/// Numeric precision of the training state, as the config sets it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    /// 16-bit parameters and gradients with fp32 master weights (`bf16` or `fp16` enabled).
    #[default]
    Mixed16,
    /// Everything in fp32.
    Fp32,
}

/// What a framework config says that sizes memory. Unset fields take the defaults the memory
/// model states.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConfigFacts {
    /// `gradient_accumulation_steps`.
    pub gradient_accumulation: Option<u64>,
    /// `bf16`/`fp16`, where a config was given (DeepSpeed trains in fp32 without either).
    pub precision: Option<Precision>,
    /// `zero_optimization.sub_group_size`.
    pub sub_group_size: Option<u64>,
}

/// A user's DeepSpeed config, parsed.
#[derive(Clone, Debug, PartialEq)]
pub struct UserConfig {
    /// The document, which the renderer merges the offload keys into.
    pub json: Value,
    /// `zero_optimization.stage`, if stated.
    pub stage: Option<u8>,
    /// Whether it has a `zero_optimization.zenflow` section (the user's consent to ZenFlow).
    pub zenflow: bool,
    /// Whether it trains in bf16 (`bf16.enabled`).
    pub bf16: bool,
    /// Whether it keeps the optimizer state in bf16 (`bf16.bf16_optimizer_states`: the user's
    /// consent to it).
    pub bf16_states: bool,
    /// What sizes memory.
    pub facts: ConfigFacts,
}

/// Why the user's config cannot be used. Every message says where it should have come from.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// The referenced ConfigMap does not exist.
    #[error(
        "ConfigMap {name:?} (spec.deepspeed.configMapRef) does not exist in namespace {namespace:?}"
    )]
    MissingConfigMap {
        /// ConfigMap name.
        name: String,
        /// Namespace.
        namespace: String,
    },
    /// The ConfigMap lacks the key.
    #[error(
        "ConfigMap {name:?} has no key {key:?} (spec.deepspeed.configMapRef.key, ds_config.json when unset): {found}"
    )]
    MissingKey {
        /// ConfigMap name.
        name: String,
        /// The key.
        key: String,
        /// What the ConfigMap holds instead.
        found: String,
    },
    /// The ConfigMap was not handed to `offload-operator explain`.
    #[error(
        "ConfigMap {name:?} (spec.deepspeed.configMapRef) was not given (--deepspeed-config) and is not in the cluster"
    )]
    NotGiven {
        /// ConfigMap name.
        name: String,
    },
    /// The ConfigMap could not be read (the API server did not answer in time).
    #[error("ConfigMap {name:?} (the DeepSpeed config) could not be read: {detail}")]
    Unreadable {
        /// ConfigMap name.
        name: String,
        /// What went wrong.
        detail: String,
    },
    /// The operator's keys cannot be merged into it (a key the declared version rejects, a
    /// result larger than a ConfigMap holds).
    #[error("{0}")]
    NotMergeable(String),
    /// The text is not a usable DeepSpeed config.
    #[error("{source_name}: {error}")]
    Invalid {
        /// Where it came from (`ConfigMap "x" key "y"`).
        source_name: String,
        /// What is wrong.
        error: DeepSpeedConfigError,
    },
}

/// A DeepSpeed config the operator cannot read or merge into.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DeepSpeedConfigError {
    /// Not JSON at all.
    #[error("the DeepSpeed config is not valid JSON: {0}")]
    NotJson(String),
    /// JSON, but some part is not an object where DeepSpeed expects one.
    #[error("the DeepSpeed config's {path} must be a JSON object")]
    NotAnObject {
        /// JSON path of the offending value.
        path: &'static str,
    },
    /// `zero_optimization.stage` is not an integer from 0 to 3.
    #[error(
        "the DeepSpeed config's zero_optimization.stage must be an integer from 0 to 3, found {0}"
    )]
    BadStage(String),
    /// The user's section has a key the declared version rejects.
    #[error(
        "the DeepSpeed config's zero_optimization.{section} has key {key:?}, which DeepSpeed {version} does not accept (its parser forbids unknown keys): remove it or declare a newer framework.version"
    )]
    KeyNotAccepted {
        /// `offload_optimizer` or `offload_param`.
        section: &'static str,
        /// The key.
        key: String,
        /// The declared version.
        version: String,
    },
}

/// Parses the user's DeepSpeed JSON and returns its `zero_optimization.stage`, if stated.
pub fn stage_of(config: &Value) -> Result<Option<u8>, DeepSpeedConfigError> {
    let Some(root) = config.as_object() else {
        return Err(DeepSpeedConfigError::NotAnObject { path: "top level" });
    };
    let Some(zero) = root.get("zero_optimization") else {
        return Ok(None);
    };
    let Some(zero) = zero.as_object() else {
        return Err(DeepSpeedConfigError::NotAnObject {
            path: "zero_optimization",
        });
    };
    match zero.get("stage") {
        None => Ok(None),
        Some(v) => match v.as_u64() {
            Some(s @ 0..=3) => Ok(Some(s as u8)),
            _ => Err(DeepSpeedConfigError::BadStage(v.to_string())),
        },
    }
}

/// Parses a DeepSpeed JSON document.
pub fn parse_config(text: &str) -> Result<Value, DeepSpeedConfigError> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| DeepSpeedConfigError::NotJson(e.to_string()))?;
    stage_of(&value)?;
    Ok(value)
}

fn positive(v: Option<&Value>) -> Option<u64> {
    v.and_then(Value::as_u64).filter(|n| *n >= 1)
}

impl UserConfig {
    /// Parses a config's text; `source` names where it came from, for the message.
    pub fn parse(text: &str, source: &str) -> Result<UserConfig, ConfigError> {
        let invalid = |error| ConfigError::Invalid {
            source_name: source.to_string(),
            error,
        };
        let json = parse_config(text).map_err(invalid)?;
        let stage = stage_of(&json).map_err(invalid)?;
        let enabled = |key: &str| {
            json.get(key)
                .and_then(|s| s.get("enabled"))
                .and_then(Value::as_bool)
                .unwrap_or(false)
        };
        let zero = json.get("zero_optimization");
        let facts = ConfigFacts {
            gradient_accumulation: positive(json.get("gradient_accumulation_steps")),
            precision: Some(
                if enabled("bf16") || enabled("fp16") || enabled("bfloat16") {
                    Precision::Mixed16
                } else {
                    Precision::Fp32
                },
            ),
            sub_group_size: positive(zero.and_then(|z| z.get("sub_group_size"))),
        };
        let bf16_flag = |key: &str| {
            json.get("bf16")
                .and_then(|s| s.get(key))
                .and_then(Value::as_bool)
                .unwrap_or(false)
        };
        Ok(UserConfig {
            zenflow: zero.and_then(|z| z.get("zenflow")).is_some(),
            bf16: enabled("bf16") || enabled("bfloat16"),
            bf16_states: bf16_flag("bf16_optimizer_states"),
            json,
            stage,
            facts,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_gives_its_stage_precision_and_step() {
        let c = UserConfig::parse(
            r#"{"bf16": {"enabled": true}, "gradient_accumulation_steps": 8,
                "zero_optimization": {"stage": 3, "sub_group_size": 100000000, "zenflow": {}}}"#,
            "test",
        )
        .unwrap();
        assert_eq!(c.stage, Some(3));
        assert!(c.zenflow);
        assert_eq!(c.facts.gradient_accumulation, Some(8));
        assert_eq!(c.facts.precision, Some(Precision::Mixed16));
        assert_eq!(c.facts.sub_group_size, Some(100_000_000));
        let fp32 = UserConfig::parse(r#"{"gradient_accumulation_steps": 0}"#, "t").unwrap();
        assert_eq!(fp32.facts.precision, Some(Precision::Fp32));
        assert_eq!(fp32.facts.gradient_accumulation, None);
    }

    #[test]
    fn a_bad_config_names_its_source() {
        for text in ["{", "[]", r#"{"zero_optimization": {"stage": 7}}"#] {
            let err = UserConfig::parse(text, "ConfigMap \"ds\" key \"k\"").unwrap_err();
            assert!(err.to_string().starts_with("ConfigMap \"ds\""), "{err}");
        }
    }
}

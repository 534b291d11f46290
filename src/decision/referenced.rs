//! The ConfigMaps a job references — its DeepSpeed JSON and its model's `config.json` — read one
//! way for the controller, the webhook and `offload-operator explain`: which ConfigMap and key
//! (the default key where the reference names none), what an absent ConfigMap or key means,
//! and the parse. Each caller only fetches the ConfigMap (the controller from the API server,
//! retrying what does not answer; the webhook within its deadline; `explain` from the cluster
//! or from files) and hands over what it got.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use offload_api::names;
use offload_api::v1alpha1::TrainingJob;
use serde_json::Value;

use crate::decision::frameworks::user_config::ConfigError;
use crate::decision::frameworks::user_config::UserConfig;
use crate::decision::model::model_config;
use crate::decision::model::model_config::MODEL_CONFIG_KEY;
use crate::decision::model::model_config::ModelConfigError;
use crate::decision::model::shape::ModelShape;

/// The key a DeepSpeed ConfigMap holds its JSON under when the reference names none.
pub const DEEPSPEED_CONFIG_KEY: &str = "ds_config.json";

/// A reference to one key of a ConfigMap in the job's namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reference {
    /// The ConfigMap.
    pub name: String,
    /// The key (the reference's, else the default).
    pub key: String,
    /// What names it, for messages: `spec.model.configMapRef` or the annotation.
    pub origin: &'static str,
}

/// What a caller got when it fetched a referenced ConfigMap.
#[derive(Clone, Debug)]
pub enum Fetched {
    /// It does not exist.
    Absent,
    /// It could not be read (no answer in time), and why.
    Unreadable(String),
    /// It.
    Found(Box<ConfigMap>),
}

impl Reference {
    /// A TrainingJob's DeepSpeed config (`spec.deepspeed.configMapRef`).
    pub fn deepspeed(tj: &TrainingJob) -> Option<Reference> {
        let r = tj.spec.deepspeed.as_ref()?.config_map_ref.as_ref()?;
        Some(Reference {
            name: r.name.clone(),
            key: r.key.clone().unwrap_or_else(|| DEEPSPEED_CONFIG_KEY.into()),
            origin: "spec.deepspeed.configMapRef",
        })
    }

    /// A TrainingJob's model `config.json` (`spec.model.configMapRef`).
    pub fn model(tj: &TrainingJob) -> Option<Reference> {
        let r = tj.spec.model.as_ref()?.config_map_ref.as_ref()?;
        Some(Reference {
            name: r.name.clone(),
            key: r.key.clone().unwrap_or_else(|| MODEL_CONFIG_KEY.into()),
            origin: "spec.model.configMapRef",
        })
    }

    /// The same two references of a TrainingJob as an admission review carries it (its raw
    /// JSON): `(deepspeed, model)`.
    pub fn of_json(obj: &Value) -> (Option<Reference>, Option<Reference>) {
        let at = |pointer: &str, default: &str, origin: &'static str| {
            let r = obj.pointer(pointer)?;
            Some(Reference {
                name: r.get("name")?.as_str()?.to_string(),
                key: r
                    .get("key")
                    .and_then(Value::as_str)
                    .unwrap_or(default)
                    .to_string(),
                origin,
            })
        };
        (
            at(
                "/spec/deepspeed/configMapRef",
                DEEPSPEED_CONFIG_KEY,
                "spec.deepspeed.configMapRef",
            ),
            at(
                "/spec/model/configMapRef",
                MODEL_CONFIG_KEY,
                "spec.model.configMapRef",
            ),
        )
    }

    /// Another kind's model `config.json` (annotation `offload.dev/model-config`).
    pub fn model_annotation(annotations: &BTreeMap<String, String>) -> Option<Reference> {
        Some(Reference {
            name: annotations.get(names::ANNOTATION_MODEL_CONFIG)?.clone(),
            key: MODEL_CONFIG_KEY.into(),
            origin: "annotation offload.dev/model-config",
        })
    }

    fn source_name(&self) -> String {
        format!("ConfigMap {:?} key {:?}", self.name, self.key)
    }

    /// The DeepSpeed config `fetched` holds under this reference.
    pub fn user_config(
        &self,
        namespace: &str,
        fetched: Fetched,
    ) -> Result<UserConfig, ConfigError> {
        let cm = match fetched {
            Fetched::Absent => {
                return Err(ConfigError::MissingConfigMap {
                    name: self.name.clone(),
                    namespace: namespace.to_string(),
                });
            }
            Fetched::Unreadable(detail) => {
                return Err(ConfigError::Unreadable {
                    name: self.name.clone(),
                    detail,
                });
            }
            Fetched::Found(cm) => *cm,
        };
        let text = model_config::config_map_key(&cm, &self.key).map_err(|found| {
            ConfigError::MissingKey {
                name: self.name.clone(),
                key: self.key.clone(),
                found,
            }
        })?;
        UserConfig::parse(&text, &self.source_name())
    }

    /// The model shape `fetched` holds under this reference.
    pub fn model_shape(
        &self,
        namespace: &str,
        fetched: Fetched,
    ) -> Result<ModelShape, ModelConfigError> {
        let cm = match fetched {
            Fetched::Absent => {
                return Err(ModelConfigError::MissingConfigMap {
                    name: self.name.clone(),
                    namespace: namespace.to_string(),
                    origin: self.origin,
                });
            }
            Fetched::Unreadable(detail) => {
                return Err(ModelConfigError::Unreadable {
                    name: self.name.clone(),
                    detail,
                });
            }
            Fetched::Found(cm) => *cm,
        };
        let text = model_config::config_map_key(&cm, &self.key).map_err(|found| {
            ModelConfigError::MissingKey {
                name: self.name.clone(),
                key: self.key.clone(),
                found,
            }
        })?;
        model_config::parse(&text, &format!("{} ({})", self.source_name(), self.origin))
    }
}

/// A ConfigMap holding `text` under `key` (a file handed to `explain` stands for the key the
/// job references).
pub fn config_map_of(name: &str, key: &str, text: &str) -> ConfigMap {
    ConfigMap {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(key.to_string(), text.to_string())])),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_reading_of_a_reference_for_every_caller() {
        let obj = serde_json::json!({"spec": {
            "deepspeed": {"configMapRef": {"name": "ds"}},
            "model": {"configMapRef": {"name": "m", "key": "llama.json"}}
        }});
        let (ds, model) = Reference::of_json(&obj);
        let (ds, model) = (ds.unwrap(), model.unwrap());
        assert_eq!(
            (ds.name.as_str(), ds.key.as_str()),
            ("ds", DEEPSPEED_CONFIG_KEY)
        );
        assert_eq!(
            (model.name.as_str(), model.key.as_str()),
            ("m", "llama.json")
        );
        // The key the job names is the key read, whoever fetched the ConfigMap.
        let cm = config_map_of("m", "config.json", r#"{"model_type": "llama"}"#);
        let err = model
            .model_shape("ns", Fetched::Found(Box::new(cm)))
            .unwrap_err();
        assert!(
            err.to_string().contains("no key \"llama.json\"")
                && err.to_string().contains("\"config.json\""),
            "{err}"
        );
        let err = ds.user_config("ns", Fetched::Absent).unwrap_err();
        assert!(
            err.to_string()
                .contains("does not exist in namespace \"ns\""),
            "{err}"
        );
        let err = ds
            .user_config("ns", Fetched::Unreadable("no answer within 2s".into()))
            .unwrap_err();
        assert!(
            err.to_string().contains("could not be read: no answer"),
            "{err}"
        );
        let ok = ds
            .user_config(
                "ns",
                Fetched::Found(Box::new(config_map_of(
                    "ds",
                    DEEPSPEED_CONFIG_KEY,
                    r#"{"zero_optimization": {"stage": 3}}"#,
                ))),
            )
            .unwrap();
        assert_eq!(ok.stage, Some(3));
        let annotated = BTreeMap::from([(names::ANNOTATION_MODEL_CONFIG.to_string(), "m".into())]);
        let r = Reference::model_annotation(&annotated).unwrap();
        assert_eq!(r.origin, "annotation offload.dev/model-config");
        let err = r.model_shape("ns", Fetched::Absent).unwrap_err();
        assert!(
            err.to_string()
                .contains("annotation offload.dev/model-config"),
            "{err}"
        );
    }
}

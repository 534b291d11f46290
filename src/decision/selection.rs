//! Opt-in and profile selection: the one rule the controller and the webhook both follow.

use kube::ResourceExt;

use offload_api::names;
use offload_api::v1alpha1::{
    ModeSetting, OffloadProfileSpec, OverlapSetting, RatioSetting, Switch, TrainingJob,
};

/// Whether a TrainingJob opted in: it names a profile, or sets an offload field explicitly.
pub fn opted_in(tj: &TrainingJob) -> bool {
    tj.annotations().contains_key(names::PROFILE_ANNOTATION) || explicit_offload(tj)
}

/// Whether any `spec.offload` field of the job is set to something other than `Auto`.
pub fn explicit_offload(tj: &TrainingJob) -> bool {
    let o = &tj.spec.offload;
    o.mode != ModeSetting::Auto
        || o.overlap != OverlapSetting::Auto
        || o.offload_ratio != RatioSetting::Auto
        || o.pin_memory != Switch::Auto
}

/// The profile a TrainingJob's annotation names, as written (`None` without the annotation).
pub fn requested_profile(tj: &TrainingJob) -> Option<&str> {
    tj.annotations()
        .get(names::PROFILE_ANNOTATION)
        .map(String::as_str)
}

/// The name a request resolves to: `auto`, or no name at all, means [`names::DEFAULT_PROFILE`].
pub fn profile_name(requested: Option<&str>) -> &str {
    match requested {
        Some(names::PROFILE_AUTO) | None => names::DEFAULT_PROFILE,
        Some(name) => name,
    }
}

/// The profile a TrainingJob resolves with, by name (see [`profile_name`]).
pub fn profile_name_for(tj: &TrainingJob) -> String {
    profile_name(requested_profile(tj)).to_string()
}

/// The built-in policy used when a job names no profile and no `default` profile exists: the
/// API's defaults.
pub fn builtin_default_profile() -> OffloadProfileSpec {
    OffloadProfileSpec::default()
}

/// The profile a decision is made with.
#[derive(Clone, Debug, PartialEq)]
pub struct SelectedProfile {
    /// Its name (`default` for the built-in defaults).
    pub name: String,
    /// Its policy.
    pub spec: OffloadProfileSpec,
    /// Whether the built-in defaults stand in for a missing `default` profile.
    pub builtin: bool,
}

/// A job names a profile that does not exist.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "OffloadProfile {name:?} does not exist: create it or change the {} label or annotation",
    names::PROFILE_ANNOTATION
)]
pub struct ProfileNotFound {
    /// The missing profile.
    pub name: String,
}

/// Picks the profile for a request: the named one (`auto` naming `default`) must exist; a job
/// that names none (it opted in through explicit offload fields) uses `default` when it exists
/// and the built-in defaults otherwise.
pub fn select_profile(
    requested: Option<&str>,
    lookup: impl FnOnce(&str) -> Option<OffloadProfileSpec>,
) -> Result<SelectedProfile, ProfileNotFound> {
    let name = profile_name(requested);
    match (lookup(name), requested) {
        (Some(spec), _) => Ok(SelectedProfile {
            name: name.to_string(),
            spec,
            builtin: false,
        }),
        (None, None) => Ok(SelectedProfile {
            name: name.to_string(),
            spec: builtin_default_profile(),
            builtin: true,
        }),
        (None, Some(_)) => Err(ProfileNotFound {
            name: name.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn custom() -> OffloadProfileSpec {
        OffloadProfileSpec {
            mode: ModeSetting::CpuCopy,
            ..OffloadProfileSpec::default()
        }
    }

    #[test]
    fn one_rule_for_every_caller() {
        let only_pool = |name: &str| (name == "pool").then(custom);
        let with_default =
            |name: &str| matches!(name, "pool" | "default").then(builtin_default_profile);
        // A named profile must exist.
        assert_eq!(
            select_profile(Some("pool"), only_pool).unwrap().spec,
            custom()
        );
        assert_eq!(
            select_profile(Some("gone"), only_pool).unwrap_err().name,
            "gone"
        );
        // `auto` names `default`, which must exist.
        assert_eq!(
            select_profile(Some("auto"), only_pool).unwrap_err().name,
            "default"
        );
        let auto = select_profile(Some("auto"), with_default).unwrap();
        assert_eq!((auto.name.as_str(), auto.builtin), ("default", false));
        // No name at all: `default` when it exists, else the built-in defaults.
        let fallback = select_profile(None, only_pool).unwrap();
        assert_eq!(
            (fallback.name.as_str(), fallback.builtin),
            ("default", true)
        );
        assert!(!select_profile(None, with_default).unwrap().builtin);
    }
}

//! DeepSpeed `zero_optimization` rendering, per declared version.
//!
//! DeepSpeed's config models forbid unknown keys, so every key written here is checked against
//! what the declared version accepts ([`accepted_offload_optimizer_keys`]).

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use crate::decision::DeepSpeedConfigError;
use crate::decision::{
    DeepSpeedPlan, Resolution, SUPER_OFFLOAD_CPU_SHARE, ZENFLOW_TOPK_RATIO, ZENFLOW_UPDATE_INTERVAL,
};
use offload_api::v1alpha1::OffloadMode;
use offload_api::version::{FrameworkVersion, deepspeed};

/// File name of the rendered config inside its mount.
pub const CONFIG_FILE_NAME: &str = "ds_config.json";
/// Default mount directory of the rendered config.
pub const DEFAULT_MOUNT_PATH: &str = "/etc/offload";

/// Keys of `zero_optimization.offload_optimizer` that `version` accepts at `stage`.
pub fn accepted_offload_optimizer_keys(
    version: &FrameworkVersion,
    stage: u8,
) -> BTreeSet<&'static str> {
    let mut keys = BTreeSet::from([
        "device",
        "nvme_path",
        "buffer_count",
        "pin_memory",
        "pipeline_read",
        "pipeline_write",
        "fast_init",
    ]);
    if stage == 3 && deepspeed::has(version, deepspeed::RATIO) {
        keys.insert("ratio");
    }
    if deepspeed::has(version, deepspeed::SUPER_OFFLOAD) {
        keys.insert("super_offload");
        keys.insert("cpuadam_cores_perc");
    }
    keys
}

/// Keys of `zero_optimization.offload_param` that every supported version accepts (the section
/// only takes effect at ZeRO stage 3).
pub fn accepted_offload_param_keys() -> BTreeSet<&'static str> {
    BTreeSet::from([
        "device",
        "nvme_path",
        "buffer_count",
        "buffer_size",
        "max_in_cpu",
        "pin_memory",
    ])
}

/// The operator's `zero_optimization` section on its own (no user config).
pub fn render_section(res: &Resolution, plan: &DeepSpeedPlan) -> Value {
    match merge_config(&json!({}), res, plan) {
        Ok(v) => v,
        // Merging into an empty object cannot fail; fall back to the bare offload keys anyway.
        Err(_) => json!({"zero_optimization": {"offload_optimizer": {"device": device(res)}}}),
    }
}

fn device(res: &Resolution) -> &'static str {
    match res.mode {
        OffloadMode::Disabled => "none",
        OffloadMode::UnifiedMemory | OffloadMode::CpuCopy => "cpu",
    }
}

/// Merges the offload section into the user's DeepSpeed JSON. Only the keys the operator owns
/// change (`device`, `pin_memory`, `ratio`, `super_offload`, `cpuadam_cores_perc` of the two
/// offload sections, and `stage` and, with a partial ratio, `sub_group_size` when the user's
/// config lacks them; `bf16`'s state keys where the decision keeps the optimizer state in
/// bf16); every other key is kept as written. Merging twice gives the same
/// document.
pub fn merge_config(
    user: &Value,
    res: &Resolution,
    plan: &DeepSpeedPlan,
) -> Result<Value, DeepSpeedConfigError> {
    let mut root = user
        .as_object()
        .cloned()
        .ok_or(DeepSpeedConfigError::NotAnObject { path: "top level" })?;
    let zero = section(&mut root, "zero_optimization", "zero_optimization")?;
    if plan.write_stage && !zero.contains_key("stage") {
        zero.insert("stage".into(), json!(plan.stage));
    }
    // With a partial ratio DeepSpeed offloads whole optimizer sub-groups: small ones land the
    // share offloaded near the ratio the memory model checked. A user's own size is kept.
    if let Some(group) = plan.sub_group_size
        && !zero.contains_key("sub_group_size")
    {
        zero.insert("sub_group_size".into(), json!(group));
    }
    write_offload_optimizer(zero, res, plan)?;
    if plan.zenflow {
        write_zenflow(zero)?;
    }
    write_offload_param(zero, res, plan)?;
    if plan.bf16_optimizer_states {
        let bf16 = section(&mut root, "bf16", "bf16")?;
        bf16.insert("enabled".into(), json!(true));
        bf16.insert("bf16_master_weights_and_grads".into(), json!(true));
        bf16.insert("bf16_optimizer_states".into(), json!(true));
    }
    Ok(Value::Object(root))
}

/// The object under `key` of `parent`, created empty when absent; `path` names it in errors.
fn section<'a>(
    parent: &'a mut Map<String, Value>,
    key: &str,
    path: &'static str,
) -> Result<&'a mut Map<String, Value>, DeepSpeedConfigError> {
    parent
        .entry(key)
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .ok_or(DeepSpeedConfigError::NotAnObject { path })
}

/// `offload_optimizer`: device, pinning, the ratio and SuperOffload as decided; any key this
/// DeepSpeed version does not accept is refused.
fn write_offload_optimizer(
    zero: &mut Map<String, Value>,
    res: &Resolution,
    plan: &DeepSpeedPlan,
) -> Result<(), DeepSpeedConfigError> {
    // Nothing offloaded and no section of the user's: nothing to say (DeepSpeed's default is
    // no offload); a section the user wrote gets device none.
    if res.mode == OffloadMode::Disabled && !zero.contains_key("offload_optimizer") {
        return Ok(());
    }
    let optimizer_keys = accepted_offload_optimizer_keys(&plan.version, plan.stage);
    let opt = section(
        zero,
        "offload_optimizer",
        "zero_optimization.offload_optimizer",
    )?;
    opt.insert("device".into(), json!(device(res)));
    opt.insert("pin_memory".into(), json!(res.pin_memory));
    if plan.write_ratio {
        opt.insert("ratio".into(), json!(res.ratio));
    } else {
        opt.remove("ratio");
    }
    if plan.super_offload {
        opt.insert("super_offload".into(), json!(true));
        opt.insert("cpuadam_cores_perc".into(), json!(SUPER_OFFLOAD_CPU_SHARE));
    } else {
        opt.remove("super_offload");
        opt.remove("cpuadam_cores_perc");
    }
    if let Some(key) = opt.keys().find(|k| !optimizer_keys.contains(k.as_str())) {
        return Err(DeepSpeedConfigError::KeyNotAccepted {
            section: "offload_optimizer",
            key: key.clone(),
            version: plan.version.to_string(),
        });
    }
    Ok(())
}

/// `zenflow`: the operator's defaults under whatever the user wrote in their own section.
fn write_zenflow(zero: &mut Map<String, Value>) -> Result<(), DeepSpeedConfigError> {
    let zf = section(zero, "zenflow", "zero_optimization.zenflow")?;
    for (k, v) in [
        ("topk_ratio", json!(ZENFLOW_TOPK_RATIO)),
        ("select_strategy", json!("auto")),
        ("select_interval", json!("auto")),
        ("update_interval", json!(ZENFLOW_UPDATE_INTERVAL)),
        ("full_warm_up_rounds", json!(0)),
    ] {
        zf.entry(k).or_insert(v);
    }
    zf.insert("overlap_step".into(), json!(true));
    Ok(())
}

/// `offload_param`, where parameters are offloaded or the user's config has the section (then
/// set to `none` unless decided otherwise).
fn write_offload_param(
    zero: &mut Map<String, Value>,
    res: &Resolution,
    plan: &DeepSpeedPlan,
) -> Result<(), DeepSpeedConfigError> {
    let param_keys = accepted_offload_param_keys();
    if !(plan.offload_params || zero.contains_key("offload_param")) {
        return Ok(());
    }
    let param = section(zero, "offload_param", "zero_optimization.offload_param")?;
    let device = if plan.offload_params {
        device(res)
    } else {
        "none"
    };
    param.insert("device".into(), json!(device));
    param.insert(
        "pin_memory".into(),
        json!(res.pin_memory && plan.offload_params),
    );
    if let Some(key) = param.keys().find(|k| !param_keys.contains(k.as_str())) {
        return Err(DeepSpeedConfigError::KeyNotAccepted {
            section: "offload_param",
            key: key.clone(),
            version: plan.version.to_string(),
        });
    }
    Ok(())
}

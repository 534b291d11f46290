//! The decision with the memory model: no offload where the job fits, the fastest offload that
//! fits where it does not, never a configuration that cannot run.
use super::*;
use crate::decision::model::memory::Placement;
use offload_api::v1alpha1::{ModeSetting, NodeClass, OffloadMode, RatioSetting};

/// 125 GiB, the lent H200 host.
pub(super) const H200_HOST: u64 = 125 << 30;

fn with_model(mut job: JobRequest, parameters: u64, layers: i64) -> JobRequest {
    job.model = Some(bench_hints(parameters, 2048, layers));
    job
}

pub(super) fn placement(res: &Resolution) -> Option<Placement> {
    res.memory.as_ref().map(|m| m.placement)
}

#[test]
fn a_job_that_fits_runs_without_offload_and_says_so_with_the_figures() {
    for (p, layers) in [(1_138_241_536, 20), (3_821_770_752, 32)] {
        let job = with_model(deepspeed("0.19.8"), p, layers);
        let res = resolve(&job, &[with_host(h200("h"), H200_HOST)]).unwrap();
        assert_eq!(res.mode, OffloadMode::Disabled, "{}", res.summary());
        assert_eq!(placement(&res), Some(Placement::NoOffload));
        let why = reason(&res, Field::Mode);
        assert!(
            why.contains("needs about")
                && why.contains("each GPU can hold")
                && why.contains("fits without offload"),
            "{why}"
        );
        // Nothing offloaded: the DeepSpeed plan writes device none.
        let plan = ds_plan(&res);
        assert!(!plan.offload_params && !plan.write_ratio);
        // The only class fits: any GPU node will do.
        assert_eq!(res.node_class, None);
    }
}

#[test]
fn a_job_that_does_not_fit_gets_the_smallest_offload_that_fits() {
    let job = with_model(deepspeed("0.19.8"), 9_122_865_152, 44);
    let res = resolve(&job, &[with_host(h200("h"), H200_HOST)]).unwrap();
    assert_eq!(res.mode, OffloadMode::CpuCopy);
    assert!(matches!(placement(&res), Some(Placement::PartialOptimizer(r)) if r == res.ratio));
    let m = res.memory.as_ref().unwrap();
    assert!(m.gpu_bytes <= m.gpu_budget_bytes);
    assert!(m.host_bytes_per_pod <= m.host_budget_bytes.unwrap());
    assert!(reason(&res, Field::Mode).contains("does not fit in GPU memory without offload"));
}

#[test]
fn past_the_partial_share_that_pays_offloading_parameters_too_is_faster() {
    // 20B on one H200 with 1 TiB of host memory: the share the GPU cannot hold is large, so
    // optimizer state and parameters go to the host together (measured faster above 45%).
    let job = with_model(deepspeed("0.19.8"), 20_000_000_000, 96);
    let res = resolve(&job, &[with_host(h200("h"), 1 << 40)]).unwrap();
    assert_eq!(
        placement(&res),
        Some(Placement::OptimizerAndParams),
        "{}",
        res.summary()
    );
    assert_eq!(res.ratio, 1.0);
    assert!(ds_plan(&res).offload_params);
    // The same job refusing offload_param gets the partial share instead.
    let mut no_params = job.clone();
    no_params.deepspeed.offload_params = Some(false);
    let res = resolve(&no_params, &[with_host(h200("h"), 1 << 40)]).unwrap();
    assert!(matches!(placement(&res), Some(Placement::PartialOptimizer(r)) if r > 0.45));
    assert!(!ds_plan(&res).offload_params);
}

#[test]
fn nothing_that_cannot_run_is_written_and_the_hold_says_what_would_fit() {
    // 13B on one H200 with 125 GiB of host memory: no placement fits GPU and host.
    let job = with_model(deepspeed("0.19.8"), 12_910_000_000, 40);
    let err = resolve(&job, &[with_host(h200("h"), H200_HOST)]).unwrap_err();
    assert_eq!(err.category(), "InsufficientMemory");
    assert!(err.depends_on_cluster());
    let msg = err.to_string();
    assert!(msg.contains("host memory too small"), "{msg}");
    assert!(
        msg.contains("with 2 GPUs in all"),
        "more GPUs would shard it: {msg}"
    );

    // ZeRO-2 keeps the 16-bit parameters whole on each GPU and builds the whole model on the
    // host: 9.1B does not fit one H200 that way, and the advice names ZeRO-3, where it does.
    let mut z2 = with_model(deepspeed("0.19.8"), 9_122_865_152, 44);
    z2.deepspeed.stage_in_spec = Some(2);
    let msg = resolve(&z2, &[with_host(h200("h"), H200_HOST)])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("ZeRO stage 3 instead of 2"), "{msg}");
}

#[test]
fn an_explicit_configuration_that_cannot_run_is_refused_with_the_figures() {
    let big = with_model(deepspeed("0.19.8"), 9_122_865_152, 44);
    let mut disabled = big.clone();
    disabled.offload.mode = ModeSetting::Disabled;
    let err = resolve(&disabled, &[with_host(h200("h"), H200_HOST)]).unwrap_err();
    assert_eq!(err.category(), "ConfigurationDoesNotFit");
    let msg = err.to_string();
    assert!(
        msg.starts_with("mode Disabled (from the job) asks for no offload, which cannot run"),
        "{msg}"
    );
    assert!(msg.contains("GPU memory too small"), "{msg}");

    let mut small_ratio = big.clone();
    small_ratio.offload.mode = ModeSetting::CpuCopy;
    small_ratio.offload.offload_ratio = RatioSetting::Fixed(0.05);
    let msg = resolve(&small_ratio, &[with_host(h200("h"), H200_HOST)])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("offloadRatio 0.05 (from the job)"), "{msg}");

    // A ratio that fits is obeyed.
    let mut ok_ratio = big;
    ok_ratio.offload.offload_ratio = RatioSetting::Fixed(0.4);
    let res = resolve(&ok_ratio, &[with_host(h200("h"), H200_HOST)]).unwrap();
    assert_eq!(res.ratio, 0.4);
    assert!(reason(&res, Field::OffloadRatio).starts_with("0.4: set by the job"));
}

#[test]
fn a_class_where_the_job_fits_without_offload_comes_before_one_where_it_needs_offload() {
    // 6.7B fits one H200 (141 GB) without offload but not one GH200 (102 GB).
    let job = with_model(deepspeed("0.19.8"), 6_704_000_000, 32);
    let nodes = [gh200("gh-a"), h200("h-a")];
    let res = resolve(&job, &nodes).unwrap();
    assert_eq!(res.mode, OffloadMode::Disabled, "{}", res.summary());
    assert_eq!(
        res.node_class,
        Some(NodeClass::Discrete),
        "pinned where it fits"
    );
    // Where no class fits it without offload, the profile's order decides: Coherent first,
    // unified memory.
    let bigger = with_model(deepspeed("0.19.8"), 9_122_865_152, 44);
    let res = resolve(&bigger, &nodes).unwrap();
    assert_eq!(res.mode, OffloadMode::UnifiedMemory, "{}", res.summary());
    assert_eq!(res.node_class, Some(NodeClass::Coherent));
}

#[test]
fn more_ranks_shard_the_state_so_a_larger_model_fits() {
    let mut job = with_model(deepspeed("0.19.8"), 12_910_000_000, 40);
    job.pods = 2;
    let nodes = [
        with_host(h200("h-a"), H200_HOST),
        with_host(h200("h-b"), H200_HOST),
    ];
    let res = resolve(&job, &nodes).unwrap();
    assert_ne!(placement(&res), None);
    assert_eq!(
        res.memory
            .as_ref()
            .map(|m| m.gpu_bytes <= m.gpu_budget_bytes),
        Some(true)
    );
}

#[test]
fn the_pod_memory_limit_bounds_the_host_side() {
    let mut job = with_model(deepspeed("0.19.8"), 9_122_865_152, 44);
    job.pod_memory_limit = Some(32 << 30);
    let err = resolve(&job, &[with_host(h200("h"), H200_HOST)]).unwrap_err();
    assert_eq!(err.category(), "InsufficientMemory");
    assert!(err.to_string().contains("pod limit 32.0 GiB"), "{err}");
    assert!(
        err.to_string().contains("a pod memory limit above"),
        "{err}"
    );
}

#[test]
fn without_the_steps_tokens_a_margin_of_gpu_memory_is_kept() {
    let mut job = deepspeed("0.19.8");
    job.model = Some(offload_api::v1alpha1::ModelHints::parameters(
        offload_api::quantity::ParameterCount::new(3_821_770_752).unwrap(),
    ));
    let res = resolve(&job, &[h200("h")]).unwrap();
    assert_eq!(res.mode, OffloadMode::Disabled, "{}", res.summary());
}

/// A DeepSpeed 0.19.8 job for one of the models trained on the H200 (its `config.json`, as
/// `spec.model.configMapRef` gives it) at `tokens` per step.
pub(super) fn trained(model: &str, tokens: i64) -> JobRequest {
    let mut job = deepspeed("0.19.8");
    job.model = Some(offload_api::v1alpha1::ModelHints {
        tokens_per_step: Some(tokens),
        config_map_ref: Some(offload_api::v1alpha1::ConfigMapKeyRef {
            name: model.into(),
            key: None,
        }),
        ..Default::default()
    });
    job.model_config = Some(crate::decision::model::shape::tests::model(model));
    job
}

#[test]
fn at_the_boundary_the_fastest_configuration_that_ran_is_chosen() {
    // Measured on the H200 (docs/benchmarks/memory-h200.md): Mistral-7B at 4096 tokens and
    // Llama-3.1-8B at 2048 trained without offload (135.0 and 135.9 GiB allocated), 3× faster
    // than the partial shares the earlier model chose; the 5 % share ran out of memory.
    for (model, tokens) in [("mistral-7b", 4096), ("llama-8b", 2048), ("qwen-7b", 2048)] {
        let res = resolve(&trained(model, tokens), &[with_host(h200("h"), H200_HOST)]).unwrap();
        assert_eq!(
            placement(&res),
            Some(Placement::NoOffload),
            "{model}: {}",
            res.summary()
        );
        let why = reason(&res, Field::Mode);
        assert!(why.contains("headroom"), "{model}: {why}");
        assert!(why.contains("model counted as"), "{model}: {why}");
    }
    // The 8B is within 0.3 GiB of the limit: the reason says so and what would widen it.
    let res = resolve(
        &trained("llama-8b", 2048),
        &[with_host(h200("h"), H200_HOST)],
    )
    .unwrap();
    assert!(
        reason(&res, Field::Mode).contains("close to the limit"),
        "{}",
        res.summary()
    );
    // Llama-3.2-3B has room to spare.
    let res = resolve(
        &trained("llama-3b", 4096),
        &[with_host(h200("h"), H200_HOST)],
    )
    .unwrap();
    assert!(!reason(&res, Field::Mode).contains("close to the limit"));
}

#[test]
fn a_small_partial_share_is_never_chosen_where_it_frees_less_than_it_costs() {
    // Mistral-7B at 8192 tokens does not fit without offload. A share below about an eighth
    // costs more than it frees; what is chosen must need less than no offload would.
    let job = trained("mistral-7b", 8192);
    let res = resolve(&job, &[with_host(h200("h"), H200_HOST)]).unwrap();
    let Some(Placement::PartialOptimizer(r)) = placement(&res) else {
        panic!("{}", res.summary());
    };
    assert!(r > 0.125, "{r}: {}", res.summary());
    let none = crate::decision::estimate_placement(
        &job,
        "default",
        &profile(),
        &idx(&[with_host(h200("h"), H200_HOST)]),
        NodeClass::Discrete,
        Placement::NoOffload,
    )
    .unwrap()
    .unwrap()
    .0;
    assert!(res.memory.as_ref().unwrap().gpu_bytes < none.gpu_bytes);
}

#[test]
fn a_job_the_old_model_held_trains_with_the_share_that_ran() {
    // 10.7B at 2048 tokens: held before ("with 2 GPUs it would fit"); 45 % offloaded trained
    // (5.6 s a step, 127.5 GiB on the GPU, 117.5 GiB of the host's 125).
    let res = resolve(
        &trained("llama-10b", 2048),
        &[with_host(h200("h"), H200_HOST)],
    )
    .unwrap();
    let Some(Placement::PartialOptimizer(r)) = placement(&res) else {
        panic!("{}", res.summary());
    };
    assert!((0.35..=0.45).contains(&r), "{r}");
    let m = res.memory.as_ref().unwrap();
    assert!(
        m.gpu_bytes <= m.gpu_budget_bytes && m.host_bytes_per_pod <= m.host_budget_bytes.unwrap()
    );
}

#[test]
fn a_held_job_could_run_with_nothing_the_operator_could_write() {
    // 13B of the bench's shape on one H200 with 125 GiB: held. Every placement the operator
    // could write — no offload, each partial ratio from 1 % to 99 %, all optimizer state,
    // parameters too — is refused by the same model, so the hold is true.
    let job = with_model(deepspeed("0.19.8"), 12_910_000_000, 40);
    let nodes = [with_host(h200("h"), H200_HOST)];
    assert_eq!(
        resolve(&job, &nodes).unwrap_err().category(),
        "InsufficientMemory"
    );
    let placements = (1..100)
        .map(|h| Placement::PartialOptimizer(f64::from(h) / 100.0))
        .chain([
            Placement::NoOffload,
            Placement::Optimizer,
            Placement::OptimizerAndParams,
        ]);
    for p in placements {
        let (_, fits) = crate::decision::estimate_placement(
            &job,
            "default",
            &profile(),
            &idx(&nodes),
            NodeClass::Discrete,
            p,
        )
        .unwrap()
        .unwrap();
        assert!(!fits, "{p} would fit the job that was held");
    }
}

#[test]
fn the_host_memory_counted_on_is_requested_never_lowered() {
    // The 10.7B's 41 % share counts on about 117 GiB of host memory per pod.
    let mut job = trained("llama-10b", 2048);
    job.training_container = Some((0, None));
    let res = resolve(&job, &[with_host(h200("h"), H200_HOST)]).unwrap();
    let r = res.memory_request.expect("a request is written");
    assert_eq!(r.container, 0);
    assert_eq!(r.bytes % (1 << 20), 0, "whole MiB");
    assert!(r.bytes >= res.memory.as_ref().unwrap().host_bytes_per_pod);
    assert!(
        reason(&res, Field::Mode).contains("requests"),
        "{}",
        res.summary()
    );
    // A user's larger request stays: nothing written.
    job.training_container = Some((0, Some(200 << 30)));
    assert_eq!(
        resolve(&job, &[with_host(h200("h"), H200_HOST)])
            .unwrap()
            .memory_request,
        None
    );
    // A smaller one is raised, and says from what.
    job.training_container = Some((0, Some(16 << 30)));
    let res = resolve(&job, &[with_host(h200("h"), H200_HOST)]).unwrap();
    assert_eq!(res.memory_request.unwrap().raised_from, Some(16 << 30));
    assert!(
        res.summary().contains("raised from 16.0 GiB"),
        "{}",
        res.summary()
    );
    // A limit below what the configuration needs stays a refusal with the figures.
    job.pod_memory_limit = Some(64 << 30);
    let err = resolve(&job, &[with_host(h200("h"), H200_HOST)]).unwrap_err();
    assert!(err.to_string().contains("pod limit 64.0 GiB"), "{err}");
}

#[test]
fn the_training_container_and_its_memory_are_read_in_any_unit() {
    use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let container = |name: &str, gpu: bool, request: Option<&str>, limit: Option<&str>| Container {
        name: name.into(),
        resources: Some(ResourceRequirements {
            requests: request.map(|r| [("memory".to_string(), Quantity(r.into()))].into()),
            limits: Some(
                limit
                    .map(|l| ("memory".to_string(), Quantity(l.into())))
                    .into_iter()
                    .chain(gpu.then(|| ("nvidia.com/gpu".to_string(), Quantity("1".into()))))
                    .collect(),
            ),
            claims: None,
        }),
        ..Default::default()
    };
    let spec = PodSpec {
        containers: vec![
            container("sidecar", false, Some("1Gi"), None),
            container("train", true, Some("1e3Mi"), Some("0.5Ti")),
        ],
        ..Default::default()
    };
    let r = PodResources::of(Some(&spec)).unwrap();
    assert_eq!(
        r.training_container,
        Some(1),
        "the container that asks for GPUs"
    );
    assert_eq!(r.training_memory_request, Some(1000 << 20));
    assert_eq!(
        r.memory_limit,
        Some(1 << 39),
        "the training container's own limit"
    );
    let bad = PodSpec {
        containers: vec![container("train", true, Some("lots"), None)],
        ..Default::default()
    };
    let err = PodResources::of(Some(&bad)).unwrap_err().to_string();
    assert!(err.contains("container \"train\" requests.memory"), "{err}");
}

fn failure(
    kind: offload_api::v1alpha1::MemoryKind,
    estimate: u64,
    budget: u64,
) -> offload_api::v1alpha1::MemoryFailure {
    offload_api::v1alpha1::MemoryFailure {
        kind,
        configuration: "mode=Disabled …".into(),
        estimate_bytes: Some(estimate as i64),
        budget_bytes: Some(budget as i64),
        limit_bytes: None,
        needed_bytes: None,
        pod: "p".into(),
        message: "torch.OutOfMemoryError: CUDA out of memory".into(),
        seen_at: "2026-12-01T00:00:00Z".into(),
    }
}

#[test]
fn a_configuration_that_ran_out_of_memory_is_never_written_again() {
    use offload_api::v1alpha1::MemoryKind;
    // Mistral-7B at 4096 tokens fits without offload by the model (135.1 of 136.2 GiB). Say it
    // ran out of GPU memory there: the next decision offloads.
    let nodes = [with_host(h200("h"), H200_HOST)];
    let first = resolve(&trained("mistral-7b", 4096), &nodes).unwrap();
    assert_eq!(placement(&first), Some(Placement::NoOffload));
    let m = first.memory.clone().unwrap();
    let mut job = trained("mistral-7b", 4096);
    job.memory_failures = vec![failure(MemoryKind::Gpu, m.gpu_bytes, m.gpu_budget_bytes)];
    let second = resolve(&job, &nodes).unwrap();
    let Some(Placement::PartialOptimizer(r)) = placement(&second) else {
        panic!("{}", second.summary());
    };
    assert!(r > 0.1, "{r}");
    // Each failure compounds: the second configuration running out too moves further.
    let m2 = second.memory.clone().unwrap();
    job.memory_failures
        .push(failure(MemoryKind::Gpu, m2.gpu_bytes, m2.gpu_budget_bytes));
    let third = resolve(&job, &nodes).unwrap();
    let Some(Placement::PartialOptimizer(r3)) = placement(&third) else {
        panic!("{}", third.summary());
    };
    assert!(r3 > r, "{r3} after {r}");
    // A host kill raises the host side as the VPA does, +20 % over what the pod had (no limit:
    // its estimate), and never past the node's share it had.
    let mut job = trained("llama-10b", 2048);
    let first = resolve(&job, &nodes).unwrap();
    let m = first.memory.clone().unwrap();
    let share = m.host_budget_bytes.unwrap();
    job.memory_failures = vec![failure(MemoryKind::Host, m.host_bytes_per_pod, share)];
    let raised = resolve(&job, &nodes).unwrap();
    let r = raised.memory.clone().unwrap();
    let expected = (m.host_bytes_per_pod as f64 * 1.2).min(share as f64);
    assert!(
        (r.host_bytes_per_pod as f64) >= expected * 0.99 && r.host_bytes_per_pod <= share,
        "{} after {} (share {share})",
        r.host_bytes_per_pod,
        m.host_bytes_per_pod
    );
    // Killed at a limit far above its estimate: raised past the limit, so no share of this
    // node takes it.
    let mut limited = failure(MemoryKind::Host, m.host_bytes_per_pod, share);
    limited.limit_bytes = Some(share as i64);
    job.memory_failures = vec![limited];
    let err = resolve(&job, &nodes).unwrap_err();
    assert_eq!(err.category(), "InsufficientMemory", "{err}");
    assert!(err.to_string().contains("host memory too small"), "{err}");
}

#[test]
fn a_host_kill_is_a_vpa_bump_never_the_whole_node() {
    use crate::decision::model::memory::Corrections;
    use offload_api::v1alpha1::MemoryKind;
    let gib = 1u64 << 30;
    // 16 GiB estimated, no limit, on a 480 GiB node: +20 %, not 30 times.
    let c = Corrections::from_failures(&[failure(MemoryKind::Host, 16 * gib, 480 * gib)]);
    assert!((c.host - 1.2).abs() < 1e-9, "{}", c.host);
    // A tiny pod: at least 100 MiB more.
    let c = Corrections::from_failures(&[failure(MemoryKind::Host, 100 << 20, 480 * gib)]);
    assert!((c.host - 2.0).abs() < 1e-9, "{}", c.host);
    // Near the node's share: capped at the share.
    let c = Corrections::from_failures(&[failure(MemoryKind::Host, 450 * gib, 480 * gib)]);
    assert!((c.host - 480.0 / 450.0).abs() < 1e-9, "{}", c.host);
    // A GPU failure with the allocator's words: raised to what it needed, with the margin.
    let mut f = failure(MemoryKind::Gpu, 130 * gib, 135 * gib);
    f.needed_bytes = Some(139 * gib as i64);
    let c = Corrections::from_failures(&[f]);
    assert!((c.gpu - 139.0 / 130.0 * 1.05).abs() < 1e-9, "{}", c.gpu);
}

#[test]
fn the_optimizer_state_in_bf16_is_the_rung_a_consenting_job_takes_where_nothing_in_fp32_fits() {
    use offload_api::v1alpha1::ReasonCode;
    let job = |version: &str| {
        let mut job = with_model(deepspeed(version), 9_122_865_152, 44);
        job.deepspeed.bf16_in_config = true;
        job
    };
    let node = || with_host(h200("h"), H200_HOST);
    // What the job needs of the host in fp32 with its optimizer state offloaded.
    let fp32 = resolve(&job("0.19.8"), &[node()]).unwrap();
    assert_ne!(fp32.mode, OffloadMode::Disabled, "{}", fp32.summary());
    let fp32_host = fp32.memory.as_ref().unwrap().host_bytes_per_pod;
    // A pod limit a fifth below it: nothing in fp32 fits.
    let limit = fp32_host / 5 * 4;
    let limited = |version: &str| {
        let mut j = job(version);
        j.pod_memory_limit = Some(limit);
        j
    };
    // Without consent: held, the message offering the rung.
    let err = resolve(&limited("0.19.8"), &[node()]).unwrap_err();
    assert_eq!(err.category(), "InsufficientMemory");
    assert!(
        err.to_string()
            .contains("the optimizer state in bf16 under offload would fit as")
            && err.to_string().contains("bf16OptimizerStates"),
        "{err}"
    );
    // With the job's consent: taken, its keys planned and said, the host under the limit.
    let mut consenting = limited("0.19.8");
    consenting.deepspeed.bf16_optimizer_states = Some(true);
    let res = resolve(&consenting, &[node()]).unwrap();
    assert!(ds_plan(&res).bf16_optimizer_states, "{}", res.summary());
    assert!(
        res.reasons
            .iter()
            .any(|r| r.code == ReasonCode::Bf16OptimizerStates)
    );
    let est = res.memory.as_ref().unwrap();
    assert!(
        est.host_bytes_per_pod <= limit && est.host_bytes_per_pod < fp32_host,
        "{est:?}"
    );
    // The profile's consent does the same; the job's refusal keeps it off, offered nowhere.
    let mut profile = profile();
    profile.allow_bf16_optimizer_states = true;
    let res = resolve_offload(&limited("0.19.8"), "default", &profile, &idx(&[node()])).unwrap();
    assert!(ds_plan(&res).bf16_optimizer_states);
    let mut refusing = limited("0.19.8");
    refusing.deepspeed.bf16_optimizer_states = Some(false);
    let err = resolve_offload(&refusing, "default", &profile, &idx(&[node()])).unwrap_err();
    assert!(!err.to_string().contains("in bf16"), "{err}");
    // A DeepSpeed before 0.19.1 has no such keys: neither taken nor offered.
    let mut old = limited("0.19.0");
    old.deepspeed.bf16_optimizer_states = Some(true);
    let err = resolve(&old, &[node()]).unwrap_err();
    assert!(!err.to_string().contains("in bf16"), "{err}");
    // Where fp32 fits, consent changes nothing.
    let mut fits = job("0.19.8");
    fits.deepspeed.bf16_optimizer_states = Some(true);
    let res = resolve(&fits, &[node()]).unwrap();
    assert!(!ds_plan(&res).bf16_optimizer_states);
    assert_eq!(res.ratio, fp32.ratio);
}

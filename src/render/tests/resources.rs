//! What the rendering writes into the training container beside the framework's config: the
//! host memory the decision counts on, the allocator reporter, the CPU threads and whole cores.

use super::*;

#[test]
fn the_host_memory_counted_on_becomes_the_training_containers_request() {
    let mut res = resolved(Framework::DeepSpeed, Some("0.19.8"), fixtures::H200_READING);
    res.memory_request = Some(crate::decision::MemoryRequest {
        container: 1,
        bytes: 117_000 << 20,
        raised_from: None,
        at_floor: false,
    });
    let container = |name: &str, request: Option<&str>| Container {
        name: name.into(),
        resources: request.map(|r| ResourceRequirements {
            requests: Some([("memory".to_string(), Quantity(r.into()))].into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut spec = PodSpec {
        containers: vec![container("sidecar", Some("1Gi")), container("train", None)],
        ..Default::default()
    };
    apply_to_pod_spec(&mut spec, &res, None, &RenderOptions::default());
    let requests =
        |spec: &PodSpec, i: usize| spec.containers[i].resources.clone().unwrap_or_default();
    assert_eq!(
        requests(&spec, 1).requests.unwrap()["memory"],
        Quantity("117000Mi".into())
    );
    assert!(requests(&spec, 1).limits.is_none(), "no limit is added");
    assert_eq!(
        requests(&spec, 0).requests.unwrap()["memory"],
        Quantity("1Gi".into()),
        "other containers untouched"
    );
    // Idempotent; and a user's larger request, in any unit, is never lowered.
    let once = spec.clone();
    apply_to_pod_spec(&mut spec, &res, None, &RenderOptions::default());
    assert_eq!(spec, once);
    for larger in ["0.5Ti", "1e12", "200Gi"] {
        let mut spec = PodSpec {
            containers: vec![container("sidecar", None), container("train", Some(larger))],
            ..Default::default()
        };
        apply_to_pod_spec(&mut spec, &res, None, &RenderOptions::default());
        assert_eq!(
            requests(&spec, 1).requests.unwrap()["memory"],
            Quantity(larger.into())
        );
    }
}

#[test]
fn the_allocator_reporter_is_put_on_pythonpath_only_where_asked_and_free() {
    let mount = ConfigMount {
        config_map: "job-offload".into(),
        key: "ds_config.json".into(),
        mount_path: "/etc/offload".into(),
    };
    let pythonpath = |t: &PodTemplateSpec| {
        env_map(t.spec.as_ref().unwrap().containers[0].env.as_ref().unwrap())
            .get("PYTHONPATH")
            .cloned()
    };
    let mut res = resolved(Framework::DeepSpeed, Some("0.19.8"), fixtures::H200_READING);
    let none = RenderOptions::default();
    let mut t = template();
    apply_to_pod_template(&mut t, &res, Some(&mount), &none);
    assert_eq!(pythonpath(&t), None, "off unless the profile asks");
    res.report_allocator_peaks = true;
    let mut t = template();
    apply_to_pod_template(&mut t, &res, Some(&mount), &none);
    assert_eq!(pythonpath(&t).as_deref(), Some("/etc/offload"));
    let once = t.clone();
    apply_to_pod_template(&mut t, &res, Some(&mount), &none);
    assert_eq!(t, once, "applying twice changes nothing");
    // The user's own PYTHONPATH is never replaced.
    let mut t = template();
    t.spec.as_mut().unwrap().containers[0]
        .env
        .as_mut()
        .unwrap()
        .push(EnvVar {
            name: "PYTHONPATH".into(),
            value: Some("/app".into()),
            value_from: None,
        });
    apply_to_pod_template(&mut t, &res, Some(&mount), &none);
    assert_eq!(pythonpath(&t).as_deref(), Some("/app"));
    // The reporter itself is the file Python imports at start-up.
    assert_eq!(MEMORY_REPORT_FILE, "sitecustomize.py");
    assert!(
        MEMORY_REPORT.contains("max_memory_allocated") && MEMORY_REPORT.contains(ALLOCATOR_MARK)
    );
}

/// The start-up guard's arguments.
fn guard_args(guard: &Container) -> &[String] {
    guard.args.as_deref().unwrap_or_default()
}

/// A DeepSpeed resolution whose training container (the first) was counted `cores` CPU cores
/// and `threads` threads, and options that render the start-up guard.
fn counted_cores(cores: f64, threads: u32) -> (Resolution, RenderOptions) {
    let mut res = resolved(Framework::DeepSpeed, Some("0.19.8"), fixtures::H200_READING);
    res.cpu_cores = Some(cores);
    res.cpu_threads = Some(threads);
    res.training_container = Some(0);
    let opts = RenderOptions {
        guard_image: Some("registry/offload-agent:1".into()),
        ..Default::default()
    };
    (res, opts)
}

/// Issue #50: the training process's threads fit its CPU quota, and the start-up guard runs
/// with the same CPU limit so it can check the pod gets the cores the decision counted.
#[test]
fn threads_fit_the_quota_and_the_guard_checks_the_cores() {
    let (res, opts) = counted_cores(2.5, 2);
    let mut t = template();
    t.spec.as_mut().unwrap().containers.push(Container {
        name: "sidecar".into(),
        ..Container::default()
    });
    apply_to_pod_template(&mut t, &res, None, &opts);
    let spec = t.spec.as_ref().unwrap();
    let train = env_map(spec.containers[0].env.as_deref().unwrap());
    assert_eq!(train.get("OMP_NUM_THREADS").map(String::as_str), Some("2"));
    let sidecar = env_map(spec.containers[1].env.as_deref().unwrap());
    assert!(
        !sidecar.contains_key("OMP_NUM_THREADS"),
        "only the training container"
    );
    let guard = &spec.init_containers.as_ref().unwrap()[0];
    assert!(
        guard_args(guard).contains(&"--cpu-cores=2500m".to_string()),
        "{:?}",
        guard.args
    );
    let r = guard.resources.as_ref().unwrap();
    assert_eq!(r.limits.as_ref().unwrap()["cpu"].0, "2500m");
    assert_eq!(r.requests.as_ref().unwrap()["cpu"].0, "2500m");
    // The user's own setting stays.
    let mut mine = template();
    mine.spec.as_mut().unwrap().containers[0]
        .env
        .get_or_insert_with(Vec::new)
        .push(EnvVar {
            name: "OMP_NUM_THREADS".into(),
            value: Some("6".into()),
            value_from: None,
        });
    apply_to_pod_template(&mut mine, &res, None, &opts);
    let env = env_map(mine.spec.unwrap().containers[0].env.as_deref().unwrap());
    assert_eq!(env["OMP_NUM_THREADS"], "6");
    // Env from a ConfigMap or Secret the webhook cannot read may set it, and the container's
    // own env would win over that: nothing written.
    let mut from = template();
    from.spec.as_mut().unwrap().containers[0].env_from =
        Some(vec![k8s_openapi::api::core::v1::EnvFromSource {
            config_map_ref: Some(k8s_openapi::api::core::v1::ConfigMapEnvSource {
                name: "train-env".into(),
                optional: None,
            }),
            ..Default::default()
        }]);
    apply_to_pod_template(&mut from, &res, None, &opts);
    let env = env_map(from.spec.unwrap().containers[0].env.as_deref().unwrap());
    assert!(!env.contains_key("OMP_NUM_THREADS"), "{env:?}");
    // No quota counted: nothing written.
    let mut free = res.clone();
    free.cpu_cores = None;
    free.cpu_threads = None;
    let mut t = template();
    apply_to_pod_template(&mut t, &free, None, &opts);
    let env = env_map(t.spec.unwrap().containers[0].env.as_deref().unwrap());
    assert!(!env.contains_key("OMP_NUM_THREADS"));
}

/// Whole cores near the GPU: the training container's CPU and memory requests equal its
/// limits (the user's memory limit kept as written), the guard's too, and the guard told to
/// check the cores: the pod is Guaranteed.
#[test]
fn whole_cores_make_the_pod_guaranteed_and_the_guard_checks_them() {
    let (mut res, opts) = counted_cores(8.0, 8);
    res.whole_cores = Some(crate::decision::WholeCores {
        container: 0,
        cores: 8,
        memory_bytes: 100 << 30,
    });
    let mut t = template();
    apply_to_pod_template(&mut t, &res, None, &opts);
    let spec = t.spec.as_ref().unwrap();
    let r = spec.containers[0].resources.as_ref().unwrap();
    let (limits, requests) = (r.limits.as_ref().unwrap(), r.requests.as_ref().unwrap());
    assert_eq!(
        (limits["cpu"].0.as_str(), requests["cpu"].0.as_str()),
        ("8", "8")
    );
    assert_eq!(
        (limits["memory"].0.as_str(), requests["memory"].0.as_str()),
        ("102400Mi", "102400Mi")
    );
    let guard = &spec.init_containers.as_ref().unwrap()[0];
    assert!(guard_args(guard).contains(&"--whole-cores".to_string()));
    let g = guard.resources.as_ref().unwrap();
    for name in ["cpu", "memory"] {
        assert_eq!(
            g.limits.as_ref().unwrap()[name],
            g.requests.as_ref().unwrap()[name],
            "the guard's {name}: requests equal limits"
        );
    }
    // A memory limit of the user's stays as written and becomes the request.
    let mut mine = template();
    mine.spec.as_mut().unwrap().containers[0]
        .resources
        .get_or_insert_with(Default::default)
        .limits
        .get_or_insert_with(Default::default)
        .insert("memory".into(), Quantity("120G".into()));
    apply_to_pod_template(&mut mine, &res, None, &opts);
    let r = mine.spec.unwrap().containers[0].resources.clone().unwrap();
    assert_eq!(r.limits.unwrap()["memory"].0, "120G");
    assert_eq!(r.requests.unwrap()["memory"].0, "120G");
    // Not asked: no limit written, no flag.
    let mut plain = res.clone();
    plain.whole_cores = None;
    let mut t = template();
    apply_to_pod_template(&mut t, &plain, None, &opts);
    let spec = t.spec.unwrap();
    assert!(
        !spec.init_containers.unwrap()[0]
            .args
            .as_ref()
            .unwrap()
            .contains(&"--whole-cores".to_string())
    );
}

/// A directory holding the reporter as the operator writes it, where this machine has a
/// `python3` to run it (`None`, said, where it has none).
fn reporter_dir() -> Option<tempfile::TempDir> {
    if std::process::Command::new("python3")
        .arg("-c")
        .arg("pass")
        .status()
        .is_err()
    {
        eprintln!("skipped: no python3 on this machine");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(MEMORY_REPORT_FILE), MEMORY_REPORT).unwrap();
    Some(dir)
}

/// The reporter runs in a real Python process (a stand-in `torch` module, named as such: no
/// GPU here) and reports at a normal exit, on an exception, and before `os._exit` (which skips
/// `atexit`: the GPU run of 2026-12-06 lost every figure to it), once each.
#[test]
fn the_allocator_reporter_reports_however_the_process_ends() {
    use std::process::Command;
    let Some(dir) = reporter_dir() else {
        return;
    };
    let stand_in = "import sys, types\n\
        cuda = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True,\n\
            max_memory_allocated=lambda: 7 << 30, max_memory_reserved=lambda: 8 << 30)\n\
        sys.modules['torch'] = types.SimpleNamespace(cuda=cuda)\n";
    for (how, ends, fails) in [
        ("normal", "pass", false),
        ("os._exit", "import os; os._exit(0)", false),
        (
            "exception",
            "raise RuntimeError('CUDA out of memory. Tried to allocate 2.00 GiB')",
            true,
        ),
    ] {
        let report = dir.path().join(format!("{}.txt", how.replace('.', "")));
        let out = Command::new("python3")
            .arg("-c")
            .arg(format!("{stand_in}{ends}"))
            .env("PYTHONPATH", dir.path())
            .env("OFFLOAD_MEMORY_REPORT", &report)
            .env("RANK", "3")
            .output()
            .unwrap();
        assert_eq!(out.status.success(), !fails, "{how}: {out:?}");
        let text = std::fs::read_to_string(&report).unwrap_or_default();
        let line = format!(
            "{ALLOCATOR_MARK} rank=3 allocated={} reserved={}",
            7u64 << 30,
            8u64 << 30
        );
        assert_eq!(text.matches(&line).count(), 1, "{how}: {text:?}");
        assert_eq!(
            text.contains("CUDA out of memory"),
            fails,
            "{how}: {text:?}"
        );
    }
}

/// The reporter times training iterations through the hooks of the `torch` a process imports
/// (a stand-in package on disk, named as such: it imports through the reporter's finder as the
/// real one does, and a stand-in clock makes the times exact): an iteration starts at the first
/// module forward after an optimizer step, so micro-batches and an optimizer stepped in parts
/// count once; the first is warm-up, and a run of it alone gives no step.
#[test]
fn the_allocator_reporter_times_iterations_once_torch_is_imported() {
    use std::process::Command;
    let Some(dir) = reporter_dir() else {
        return;
    };
    let pkg = dir.path().join("standin");
    for (file, text) in [
        (
            "torch/__init__.py",
            "import types\nfrom . import nn, optim\n\
             cuda = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True,\n\
                 max_memory_allocated=lambda: 7 << 30, max_memory_reserved=lambda: 8 << 30)\n",
        ),
        ("torch/optim/__init__.py", "from . import optimizer\n"),
        (
            "torch/optim/optimizer.py",
            "_post = []\n\
             def register_optimizer_step_post_hook(h):\n    _post.append(h)\n\
             class Optimizer:\n    def step(self):\n        for h in _post:\n            h(self, (), {})\n",
        ),
        ("torch/nn/__init__.py", "from . import modules\n"),
        ("torch/nn/modules/__init__.py", "from . import module\n"),
        (
            "torch/nn/modules/module.py",
            "_pre = []\n\
             def register_module_forward_pre_hook(h):\n    _pre.append(h)\n\
             class Module:\n    def __call__(self, *a):\n        for h in _pre:\n            h(self, a)\n",
        ),
    ] {
        let path = pkg.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    // Iteration times in ms after a 900 ms warm-up; each: two micro-batches of forwards, the
    // optimizer stepped in three parts.
    let script = |iterations: &str| {
        format!(
            "import time\n\
             clock = [0.0]\n\
             time.perf_counter = lambda: clock[0]\n\
             import torch\n\
             m, opt = torch.nn.modules.module.Module(), torch.optim.optimizer.Optimizer()\n\
             for ms in [900] + {iterations}:\n\
             \x20   m(); m(); m()\n\
             \x20   clock[0] += ms / 2000.0\n\
             \x20   m(); m()\n\
             \x20   clock[0] += ms / 2000.0\n\
             \x20   opt.step(); opt.step(); opt.step()\n\
             m()\n"
        )
    };
    for (iterations, expected) in [
        (
            "[2000, 2100, 1900, 2050, 2000, 1990]",
            Some(" step_ms=2000.0 steps=6"),
        ),
        (
            "[2000, 2100, 3000, 2100, 1950]",
            Some(" step_ms=2100.0 steps=5"),
        ),
        // Read by the operator only from five iterations timed.
        ("[2000, 2100, 1900, 2050]", Some(" step_ms=2025.0 steps=4")),
        // The forward after the last step (an evaluation, here) closes its iteration.
        ("[2000]", Some(" step_ms=2000.0 steps=1")),
        ("[]", None),
    ] {
        let report = dir.path().join("report.txt");
        let _ = std::fs::remove_file(&report);
        let out = Command::new("python3")
            .arg("-c")
            .arg(script(iterations))
            .env(
                "PYTHONPATH",
                format!("{}:{}", dir.path().display(), pkg.display()),
            )
            .env("OFFLOAD_MEMORY_REPORT", &report)
            .output()
            .unwrap();
        assert!(out.status.success(), "{iterations}: {out:?}");
        let text = std::fs::read_to_string(&report).unwrap();
        let memory = format!(
            "{ALLOCATOR_MARK} rank=0 allocated={} reserved={}",
            7u64 << 30,
            8u64 << 30
        );
        match expected {
            Some(step) => assert_eq!(text.trim(), format!("{memory}{step}"), "{iterations}"),
            None => assert_eq!(text.trim(), memory, "{iterations}: no step from one"),
        }
        let read = crate::decision::runs::evidence::allocator_report(&text).unwrap();
        assert_eq!(
            read.step_seconds,
            expected
                .filter(|s| !s.ends_with("steps=4") && !s.ends_with("steps=1"))
                .map(|s| {
                    s.split_whitespace()
                        .find_map(|w| w.strip_prefix("step_ms="))
                        .unwrap()
                        .parse::<f64>()
                        .unwrap()
                        / 1000.0
                })
        );
    }
}

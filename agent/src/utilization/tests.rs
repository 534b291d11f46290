//! The GPU busy fraction: NVML's samples, recorded traces, and what a window says.

use std::cell::Cell;

use super::*;

/// A recorded utilization trace (a stand-in for a GPU that is not here): replays percents.
struct Trace {
    values: Vec<u32>,
    at: Cell<usize>,
}

impl UtilizationSource for Trace {
    fn utilization(&self, _: &[u32]) -> Result<Vec<(u32, u32)>, String> {
        let i = self.at.get();
        self.at.set(i + 1);
        match self.values.get(i % self.values.len()) {
            Some(&v) if v <= 100 => Ok(vec![(0, v)]),
            _ => Err("sample failed".into()),
        }
    }
}

#[test]
fn the_busy_fraction_is_the_mean_of_the_samples() {
    let trace = Trace {
        values: vec![100, 0, 100, 60],
        at: Cell::new(0),
    };
    let o = observe(
        &trace,
        &[],
        Duration::from_millis(0),
        Duration::from_millis(0),
    )
    .unwrap();
    // One sample with a zero window.
    assert_eq!(o[0].samples, 1);
    assert_eq!(o[0].busy_fraction, 1.0);
    let trace = Trace {
        values: vec![100, 0, 100, 60, 101],
        at: Cell::new(0),
    };
    let o = observe(
        &trace,
        &[],
        Duration::from_millis(30),
        Duration::from_millis(1),
    )
    .unwrap();
    assert!(o[0].samples >= 4, "{o:?}");
    assert!(
        o[0].busy_fraction > 0.5 && o[0].busy_fraction < 0.8,
        "{o:?}"
    );
    let broken = Trace {
        values: vec![200],
        at: Cell::new(0),
    };
    assert!(observe(&broken, &[], Duration::ZERO, Duration::ZERO).is_err());
}

#[test]
fn a_recorded_traces_memory_gives_the_windows_high_water_mark() {
    let trace: UtilizationTrace = serde_json::from_value(serde_json::json!({
        "recorded": "test", "intervalMs": 100,
        "gpus": [
            {"uuid": "GPU-a", "percent": [100], "memoryUsedBytes": [10, 70, 40],
             "memoryTotalBytes": 100},
            {"uuid": "GPU-b", "percent": [30]}
        ]
    }))
    .unwrap();
    let source = RecordedUtilization::new(trace).unwrap();
    let o = observe(
        &source,
        &[0, 1],
        Duration::from_millis(20),
        Duration::from_millis(1),
    )
    .unwrap();
    let a = o[0].memory.as_ref().expect("GPU-a has memory samples");
    assert_eq!((a.used, a.total), (70, 100));
    assert!(a.samples >= 3, "{a:?}");
    assert!(o[1].memory.is_none(), "GPU-b's recording has none");
}

#[test]
fn a_recorded_trace_replays_per_gpu_and_bad_ones_are_refused() {
    let trace: UtilizationTrace = serde_json::from_value(serde_json::json!({
        "recorded": "test", "intervalMs": 100,
        "gpus": [{"uuid": "GPU-a", "percent": [100, 0]}, {"uuid": "GPU-b", "percent": [30]}]
    }))
    .unwrap();
    let source = RecordedUtilization::new(trace).unwrap();
    assert_eq!(source.index_of("GPU-b"), Some(1));
    assert_eq!(source.index_of("GPU-c"), None);
    assert_eq!(source.utilization(&[]).unwrap(), [(0, 100), (1, 30)]);
    assert_eq!(source.utilization(&[0]).unwrap(), [(0, 0)]);
    assert!(source.utilization(&[2]).unwrap_err().contains("GPU 2"));
    for (bad, why) in [
        (
            serde_json::json!({"recorded": "", "intervalMs": 1, "gpus": []}),
            "no GPU",
        ),
        (
            serde_json::json!({"recorded": "", "intervalMs": 1,
                "gpus": [{"uuid": "GPU-a", "percent": [1]}, {"uuid": "GPU-a", "percent": [1]}]}),
            "twice",
        ),
        (
            serde_json::json!({"recorded": "", "intervalMs": 1,
                "gpus": [{"uuid": "GPU-a", "percent": []}]}),
            "0 samples",
        ),
        (
            serde_json::json!({"recorded": "", "intervalMs": 1,
                "gpus": [{"uuid": "GPU-a", "percent": [101]}]}),
            "not a percent",
        ),
    ] {
        let trace: UtilizationTrace = serde_json::from_value(bad).unwrap();
        let err = RecordedUtilization::new(trace).unwrap_err();
        assert!(err.contains(why), "{err}");
    }
    for (bad, why) in [
        (
            serde_json::json!({"recorded": "", "intervalMs": 1,
                "gpus": [{"uuid": "GPU-a", "percent": [1], "memoryUsedBytes": [5]}]}),
            "go together",
        ),
        (
            serde_json::json!({"recorded": "", "intervalMs": 1,
                "gpus": [{"uuid": "GPU-a", "percent": [1], "memoryUsedBytes": [11],
                          "memoryTotalBytes": 10}]}),
            "more than its 10",
        ),
    ] {
        let trace: UtilizationTrace = serde_json::from_value(bad).unwrap();
        let err = RecordedUtilization::new(trace).unwrap_err();
        assert!(err.contains(why), "{err}");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.json");
    std::fs::write(&path, "{\"recorded\": 1}").unwrap();
    let err = RecordedUtilization::read(&path).unwrap_err();
    assert!(
        err.starts_with(&format!("utilization trace {}", path.display())),
        "{err}"
    );
}

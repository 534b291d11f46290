use std::io::Write;

use base64::Engine;
use serde_json::{Value, json};

use super::*;

/// What the sizer wrote for a two-layer Llama at 1 × 512 tokens (tests/fixtures/traces).
const TWO_LAYERS: &str = include_str!("../../../../tests/fixtures/traces/llama-2layers-512.json");

fn fixture() -> Value {
    serde_json::from_str(TWO_LAYERS).unwrap()
}

fn parse(v: &Value) -> Result<ModelTrace, TraceError> {
    ModelTrace::parse(&v.to_string())
}

fn impossible(v: &Value) -> String {
    match parse(v) {
        Err(TraceError::Impossible(m)) => m,
        other => panic!("expected an impossible trace, got {other:?}"),
    }
}

fn packed(text: &str) -> String {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(text.as_bytes()).unwrap();
    format!(
        "gz:{}",
        base64::engine::general_purpose::STANDARD.encode(gz.finish().unwrap())
    )
}

#[test]
fn the_sizers_own_output_reads_and_its_lists_add_up() {
    let t = ModelTrace::parse(TWO_LAYERS).unwrap();
    assert_eq!(t.model_type, "llama");
    assert_eq!(t.tokens(), 512);
    let tensors = t.tensor_list();
    assert_eq!(tensors.iter().sum::<u64>(), t.parameters);
    // One embedding table (Llama-3.2-3B ties it to the output head), nine tensors a layer, the
    // final norm.
    assert_eq!(tensors.len(), 1 + 2 * 9 + 1);
    let grads = t.gradient_list();
    assert_eq!(grads.len(), tensors.len());
    // The final norm's gradient arrives first, with the most alive; the tied table's last,
    // once both its uses are done.
    assert_eq!(grads[0].numel, 3072);
    assert_eq!(grads.last().unwrap().numel, tensors[0]);
    assert!(grads[0].alive > grads.last().unwrap().alive);
    assert!(grads.iter().all(|g| g.alive <= t.peak_bytes));
    assert!(
        t.describe().contains("LlamaForCausalLM (llama)"),
        "{}",
        t.describe()
    );
}

#[test]
fn a_packed_trace_reads_as_the_plain_one() {
    let plain = ModelTrace::parse(TWO_LAYERS).unwrap();
    assert_eq!(ModelTrace::parse(&packed(TWO_LAYERS)).unwrap(), plain);
}

#[test]
fn a_sizers_failure_is_its_code_and_message() {
    let text = json!({"apiVersion": TRACE_API_VERSION, "kind": "ModelTraceError", "version": 1,
        "error": {"code": "UnknownModelType", "message": "transformers 5.17.0 does not know model_type foo"}});
    match ModelTrace::parse(&text.to_string()) {
        Err(TraceError::Sizer(f)) => {
            assert_eq!(f.code, "UnknownModelType");
            assert!(f.message.contains("model_type foo"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn another_version_or_kind_is_refused_with_what_to_do() {
    let mut v = fixture();
    v["version"] = json!(2);
    let e = parse(&v).unwrap_err().to_string();
    assert!(
        e.contains("version 2") && e.contains("sizer that ships"),
        "{e}"
    );
    let mut v = fixture();
    v["kind"] = json!("NodeReport");
    assert!(parse(&v).unwrap_err().to_string().contains("NodeReport"));
    let mut v = fixture();
    v["apiVersion"] = json!("v1");
    assert!(parse(&v).unwrap_err().to_string().contains("apiVersion"));
}

#[test]
fn a_bad_field_is_named_by_its_path() {
    let mut v = fixture();
    v["savedBytes"] = json!(-1);
    let e = parse(&v).unwrap_err().to_string();
    assert!(e.contains("savedBytes"), "{e}");
    let mut v = fixture();
    v["tensors"] = json!([[["x"], 1]]);
    let e = parse(&v).unwrap_err().to_string();
    assert!(e.contains("tensors"), "{e}");
}

#[test]
fn counts_that_do_not_add_up_are_refused() {
    let mut v = fixture();
    v["parameters"] = json!(v["parameters"].as_u64().unwrap() + 1);
    assert!(impossible(&v).contains("its tensors hold"));
    let mut v = fixture();
    v["largestTensor"] = json!(1);
    assert!(impossible(&v).contains("largest tensor"));
    let mut v = fixture();
    v["peakBytes"] = json!(v["savedBytes"].as_u64().unwrap() - 1);
    assert!(impossible(&v).contains("a peak is the most"));
    let mut v = fixture();
    v["peakBytes"] = json!(MAX_TRACE_FIGURE_BYTES + 1);
    assert!(impossible(&v).contains("more than any GPU"));
}

#[test]
fn runs_that_expand_past_any_model_are_refused_before_expanding() {
    let mut v = fixture();
    // 2^63 repeats of one tensor would take forever to expand and overflow every sum.
    v["tensors"] = json!([[[1], u64::MAX / 2]]);
    assert!(impossible(&v).contains("more than"));
    let mut v = fixture();
    v["gradients"] = json!([[[[1, 0]], u64::MAX]]);
    assert!(impossible(&v).contains("more gradients"));
}

#[test]
fn alive_bytes_below_zero_or_past_the_peak_are_refused() {
    let mut v = fixture();
    let peak = v["peakBytes"].as_u64().unwrap();
    v["gradients"] = json!([[[[1, 10], [1, 11]], 1]]);
    assert!(impossible(&v).contains("alive at a gradient"));
    v["gradients"] = json!([[[[1, peak + 1]], 1]]);
    assert!(impossible(&v).contains("alive at a gradient"));
}

#[test]
fn a_micro_batch_out_of_bounds_is_refused() {
    for (mb, seq) in [(0, 512), (1, 0), (5000, 1), (1, MAX_TRACE_TOKENS + 1)] {
        let mut v = fixture();
        v["microBatch"] = json!(mb);
        v["sequence"] = json!(seq);
        assert!(impossible(&v).contains("no micro-batch"), "{mb} x {seq}");
    }
}

#[test]
fn names_with_control_characters_or_of_any_length_are_refused() {
    let mut v = fixture();
    v["modelType"] = json!("llama\u{1b}[31m");
    assert!(impossible(&v).contains("modelType"));
    let mut v = fixture();
    v["versions"]["torch"] = json!("x".repeat(200));
    assert!(impossible(&v).contains("versions.torch"));
}

#[test]
fn text_that_is_no_trace_is_unreadable_not_a_panic() {
    for text in [
        "",
        "null",
        "[]",
        "{",
        "gz:",
        "gz:!!!!",
        "gz:aGVsbG8=",
        "{\"apiVersion\": 7}",
    ] {
        match ModelTrace::parse(text) {
            Err(TraceError::Unreadable(_)) => {}
            other => panic!("{text:?}: {other:?}"),
        }
    }
    let long = "x".repeat(MAX_TRACE_BYTES + 1);
    assert!(
        ModelTrace::parse(&long)
            .unwrap_err()
            .to_string()
            .contains("bytes")
    );
}

#[test]
fn a_packed_text_that_unpacks_past_the_bound_is_refused() {
    // 4 MiB of spaces pack into a few KiB: it must be refused, not unpacked whole.
    let bomb = packed(&" ".repeat(4 << 20));
    assert!(bomb.len() < MAX_TRACE_BYTES);
    let e = ModelTrace::parse(&bomb).unwrap_err().to_string();
    assert!(e.contains("unpacks to more than"), "{e}");
}

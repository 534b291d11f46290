//! The kubelet's gRPC APIs, generated from the upstream `.proto` files vendored under
//! `vendor/kubelet/proto` (k8s.io/kubelet, Apache-2.0) with `tonic-prost-build`, compiled by
//! `protox` (no `protoc`). The generated Rust is checked in under `vendor/kubelet/rust`; this test
//! regenerates it and fails on any drift. `OFFLOAD_WRITE_GENERATED=1` writes the files instead.

use std::path::{Path, PathBuf};

/// One generated API: the proto file, the package, where the Rust goes, which sides to build.
struct Api {
    proto: &'static str,
    package: &'static str,
    out: &'static str,
    client: bool,
    server: bool,
    /// Methods a server leaves out answer `unimplemented`.
    default_stubs: bool,
}

const APIS: [Api; 2] = [
    // The agent reads which GPUs each pod holds.
    Api {
        proto: "k8s.io/kubelet/pkg/apis/podresources/v1/api.proto",
        package: "v1",
        out: "vendor/kubelet/rust/podresources_v1.rs",
        client: true,
        server: false,
        default_stubs: false,
    },
    // The test environment's stand-in GPU device plugin registers with the kubelet and serves it.
    Api {
        proto: "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto",
        package: "v1beta1",
        out: "vendor/kubelet/rust/deviceplugin_v1beta1.rs",
        client: true,
        server: true,
        default_stubs: true,
    },
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn generate(api: &Api) -> String {
    let protos = root().join("vendor/kubelet/proto");
    let fds = protox::compile([api.proto], [&protos]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    tonic_prost_build::configure()
        .build_client(api.client)
        .build_server(api.server)
        .generate_default_stubs(api.default_stubs)
        .out_dir(dir.path())
        .compile_fds(fds)
        .unwrap();
    let generated =
        std::fs::read_to_string(dir.path().join(format!("{}.rs", api.package))).unwrap();
    format!(
        "// Generated from vendor/kubelet/proto/{} by crates/tools/tests/kubelet_protos.rs; do not edit.\n{generated}",
        api.proto
    )
}

#[test]
fn the_kubelet_apis_are_generated_from_their_protos() {
    let write = std::env::var_os("OFFLOAD_WRITE_GENERATED").is_some();
    for api in &APIS {
        let want = generate(api);
        let path = root().join(api.out);
        if write {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &want).unwrap();
            continue;
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "{} is not what vendor/kubelet/proto/{} generates: run OFFLOAD_WRITE_GENERATED=1 cargo test -p offload-tools --test kubelet_protos",
            api.out,
            api.proto
        );
    }
}

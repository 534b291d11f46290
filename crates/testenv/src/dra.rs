//! A stand-in for NVIDIA's DRA driver (k8s-dra-driver-gpu), named as such: it publishes
//! ResourceSlices shaped as that driver's kubelet plugin publishes them (driver
//! `gpu.nvidia.com`, one pool per node named after it, devices `gpu-<minor>` with the
//! attributes `type`, `uuid`, `productName`, `architecture`, `addressingMode` and a `memory`
//! capacity), and the DeviceClass its Helm chart installs. No GPU is behind them: the tests
//! check what the operator and kube-scheduler do with what the driver says.

use kube::api::{Api, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::{Value, json};

/// The stand-in's driver name, NVIDIA's.
pub const DRIVER: &str = "gpu.nvidia.com";

/// One published GPU: its addressing mode as the driver writes it (`ATS`, `HMM`, `None`, or
/// anything else to test what does not read; `None` omits the attribute).
#[derive(Clone, Debug)]
pub struct StandInGpu {
    /// The `addressingMode` attribute's value, or no attribute.
    pub addressing_mode: Option<String>,
    /// Product name.
    pub product: String,
    /// The `memory` capacity (a quantity).
    pub memory: String,
}

impl StandInGpu {
    /// A GH200's GPU: ATS.
    pub fn gh200() -> Self {
        StandInGpu {
            addressing_mode: Some("ATS".into()),
            product: "NVIDIA GH200 480GB".into(),
            memory: "97871Mi".into(),
        }
    }

    /// A PCIe H200: no ATS.
    pub fn h200() -> Self {
        StandInGpu {
            addressing_mode: Some("None".into()),
            product: "NVIDIA H200".into(),
            memory: "143771Mi".into(),
        }
    }

    /// A PCIe H100 of 80 GB: no ATS, less memory.
    pub fn h100() -> Self {
        StandInGpu {
            addressing_mode: Some("None".into()),
            product: "NVIDIA H100 80GB HBM3".into(),
            memory: "81559Mi".into(),
        }
    }
}

fn api(client: &kube::Client, kind: &str) -> Api<DynamicObject> {
    Api::all_with(
        client.clone(),
        &ApiResource::from_gvk(&GroupVersionKind::gvk("resource.k8s.io", "v1", kind)),
    )
}

/// The slice of `gpus[first..]` on `node` (slice `index` of `count` in the node's pool).
pub fn slice(node: &str, index: usize, count: usize, first: usize, gpus: &[StandInGpu]) -> Value {
    let devices: Vec<Value> = gpus
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let minor = first + i;
            let mut attributes = json!({
                "type": {"string": "gpu"},
                "uuid": {"string": format!("GPU-{node}-{minor}")},
                "productName": {"string": g.product},
                "architecture": {"string": "Hopper"},
                "driverVersion": {"version": "580.95.5"},
            });
            if let Some(mode) = &g.addressing_mode {
                attributes["addressingMode"] = json!({"string": mode});
            }
            json!({"name": format!("gpu-{minor}"), "attributes": attributes,
                   "capacity": {"memory": {"value": g.memory}}})
        })
        .collect();
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-{DRIVER}-{index}")},
        "spec": {"driver": DRIVER, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": count},
                 "devices": devices}
    })
}

/// Publishes `gpus` for `node` in slices of at most 128 devices (the API's limit), as the
/// driver's plugin does on its node.
pub async fn publish(
    client: &kube::Client,
    node: &str,
    gpus: &[StandInGpu],
) -> Result<(), kube::Error> {
    let chunks: Vec<&[StandInGpu]> = gpus.chunks(128).collect();
    let slices = api(client, "ResourceSlice");
    for (i, chunk) in chunks.iter().enumerate() {
        let obj: DynamicObject =
            serde_json::from_value(slice(node, i, chunks.len(), i * 128, chunk))
                .map_err(kube::Error::SerdeError)?;
        let name = obj.metadata.name.clone().unwrap_or_default();
        slices
            .patch(
                &name,
                &PatchParams::apply("dra-stand-in").force(),
                &Patch::Apply(&obj),
            )
            .await?;
    }
    Ok(())
}

/// The DeviceClass NVIDIA's chart installs for whole GPUs.
pub async fn device_class(client: &kube::Client) -> Result<(), kube::Error> {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": DRIVER},
        "spec": {"selectors": [{"cel": {"expression":
            format!("device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'gpu'")}}]}
    }))
    .map_err(kube::Error::SerdeError)?;
    api(client, "DeviceClass")
        .patch(
            DRIVER,
            &PatchParams::apply("dra-stand-in").force(),
            &Patch::Apply(&obj),
        )
        .await?;
    Ok(())
}

/// What the kubelet-plugin stand-in publishes and how it behaves.
#[derive(Clone, Debug)]
pub struct PluginOptions {
    /// GPUs on the node.
    pub gpus: usize,
    /// What each GPU is.
    pub gpu: StandInGpu,
    /// Never answer a prepare call (a test kills the plugin there).
    pub hang_on_prepare: bool,
}

impl Default for PluginOptions {
    fn default() -> Self {
        PluginOptions {
            gpus: 2,
            gpu: StandInGpu::h200(),
            hang_on_prepare: false,
        }
    }
}

/// The stand-in for the kubelet plugin of NVIDIA's DRA driver on the real node
/// (`hack/k8s/kube/gpu-dra-standin`, built by `hack/k8s/build.sh node` on the pinned
/// `k8s.io/dynamic-resource-allocation` helper the driver uses): it registers with the real
/// kubelet, publishes the node's ResourceSlice and prepares claims as CDI spec files. Killed
/// when dropped; it lives in the node's cgroup, so even a crashed test leaves nothing running.
pub struct KubeletPlugin {
    child: std::process::Child,
    log: std::path::PathBuf,
}

impl KubeletPlugin {
    /// Starts the stand-in on the cluster's real node; its log goes to `<cluster>/<name>.log`.
    pub fn start(
        cluster: &crate::devcluster::DevCluster,
        name: &str,
        opts: &PluginOptions,
    ) -> Result<KubeletPlugin, String> {
        let (Some(bins), Some(kubelet), Some(cdi), Some(cgroup)) = (
            cluster.node_bin_dir(),
            cluster.kubelet_dir(),
            cluster.cdi_dir(),
            cluster.node_cgroup(),
        ) else {
            return Err("the kubelet plugin needs the cluster's real node".into());
        };
        let log = cluster.root().join(format!("{name}.log"));
        let out = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = std::process::Command::new(bins.join("gpu-dra-standin"));
        cmd.arg(format!("--kubeconfig={}", cluster.kubeconfig.display()))
            .arg(format!("--node-name={}", crate::devcluster::REAL_NODE))
            .arg(format!("--kubelet-root={}", kubelet.display()))
            .arg(format!("--cdi-dir={}", cdi.display()))
            .arg(format!("--gpus={}", opts.gpus))
            .arg(format!("--product={}", opts.gpu.product))
            .arg(format!("--memory={}", opts.gpu.memory))
            .arg(format!(
                "--addressing-mode={}",
                opts.gpu.addressing_mode.as_deref().unwrap_or_default()
            ))
            .arg(format!("--hang-on-prepare={}", opts.hang_on_prepare))
            .stdout(out)
            .stderr(err);
        let child = cmd
            .spawn()
            .map_err(|e| format!("starting {}: {e}", bins.join("gpu-dra-standin").display()))?;
        let plugin = KubeletPlugin { child, log };
        crate::devcluster::node::adopt(cgroup, plugin.child.id()).map_err(|e| e.to_string())?;
        Ok(plugin)
    }

    /// Everything the plugin logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The first log line containing every one of `words`, once there is one (the log is read
    /// again every 50 ms); an error with the whole log after `timeout`, or once the plugin has
    /// exited without writing it.
    pub async fn wait_for_line(
        &mut self,
        words: &[&str],
        timeout: std::time::Duration,
    ) -> Result<String, String> {
        let start = std::time::Instant::now();
        loop {
            let log = self.log();
            if let Some(line) = log.lines().find(|l| words.iter().all(|w| l.contains(w))) {
                return Ok(line.to_string());
            }
            let exited = self.child.try_wait().ok().flatten();
            if exited.is_some() || start.elapsed() > timeout {
                return Err(format!(
                    "no line with {words:?} from the kubelet plugin ({}); its log:\n{log}",
                    exited.map_or_else(|| format!("within {timeout:?}"), |s| s.to_string())
                ));
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// Kills the plugin at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for KubeletPlugin {
    fn drop(&mut self) {
        self.kill();
    }
}

//! The real node's configuration files: containerd's, the CNI network's, the kubelet's and
//! kube-proxy's, and the node's directories.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::*;

/// containerd's configuration (version 3, containerd 2.x): everything under `dir`, the CRI
/// plugin with the pinned sandbox image, runc (and the same runc under the handler name
/// `nvidia`, as the NVIDIA container toolkit registers it on GPU nodes), the CNI plugins, CDI
/// spec files from [`cdi_dir`].
pub(crate) fn containerd_config(
    dir: &Path,
    bin_dir: &Path,
    runc: &str,
    sandbox_image: &str,
) -> String {
    let d = |p: &str| dir.join(p).display().to_string();
    let runtime = |name: &str| {
        format!(
            "
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.{name}]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.{name}.options]
          BinaryName = '{runc}'
          Root = '{root}'
          SystemdCgroup = false",
            root = d("containerd/state/runc"),
        )
    };
    format!(
        "version = 3
root = '{root}'
state = '{state}'
temp = '{tmp}'

[grpc]
  address = '{sock}'

[ttrpc]
  address = '{sock}.ttrpc'

[debug]
  level = 'warn'

[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = '{opt}'
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '{sandbox_image}'
  [plugins.'io.containerd.cri.v1.runtime']
    enable_selinux = false
    disable_apparmor = true
    # This machine's root cannot lower a process's OOM score (no CAP_SYS_RESOURCE); keep
    # containers' scores at or above containerd's own, as kind does.
    restrict_oom_score_adj = true
    tolerate_missing_hugetlb_controller = true
    disable_hugetlb_controller = true
    netns_mounts_under_state_dir = true
    # DRA drivers' kubelet plugins hand devices to containers as CDI spec files here.
    enable_cdi = true
    cdi_spec_dirs = ['{cdi}']
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
{runc_runtime}
{nvidia_runtime}
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['{cni_bin}']
      conf_dir = '{cni_conf}'
",
        root = d("containerd/root"),
        state = d("containerd/state"),
        tmp = d("containerd/tmp"),
        sock = containerd_socket(dir).display(),
        opt = d("containerd/opt"),
        runc_runtime = runtime("runc"),
        nvidia_runtime = runtime("nvidia"),
        cni_bin = bin_dir.join("cni").display(),
        cni_conf = d("cni/net.d"),
        cdi = cdi_dir(dir).display(),
    )
}

/// Where containerd reads CDI spec files (a DRA plugin writes them).
pub(crate) fn cdi_dir(dir: &Path) -> PathBuf {
    dir.join("cdi")
}

/// containerd's socket.
pub(crate) fn containerd_socket(dir: &Path) -> PathBuf {
    dir.join("containerd/containerd.sock")
}

/// The CNI configuration: one bridge on this machine with host-local addresses from
/// [`POD_CIDR`], and portmap for host ports.
pub(crate) fn cni_config(dir: &Path) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "offload-node",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": dir.join("cni/ipam").display().to_string()
                }
            },
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    })
    .to_string()
}

/// The kubelet's configuration.
pub(crate) struct KubeletSettings<'a> {
    pub dir: &'a Path,
    pub cgroup: &'a str,
    pub port: u16,
    pub healthz_port: u16,
    pub client_ca: &'a Path,
}

pub(crate) fn kubelet_config(s: &KubeletSettings) -> String {
    serde_json::json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        // This machine mounts cgroup v1; kubelet 1.35+ refuses it unless told.
        "failCgroupV1": false,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": format!("/{}", s.cgroup),
        "containerRuntimeEndpoint": format!("unix://{}", containerd_socket(s.dir).display()),
        "address": NODE_IP,
        "port": s.port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": s.healthz_port,
        "authentication": {
            "anonymous": {"enabled": false},
            "webhook": {"enabled": false},
            "x509": {"clientCAFile": s.client_ca.display().to_string()}
        },
        "authorization": {"mode": "AlwaysAllow"},
        "failSwapOn": false,
        "resolvConf": s.dir.join("resolv.conf").display().to_string(),
        "podLogsDir": s.dir.join("pod-logs").display().to_string(),
        "serializeImagePulls": false,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "rotateCertificates": false,
        "registerNode": true,
        "maxPods": 30,
        "nodeStatusUpdateFrequency": "5s"
    })
    .to_string()
}

/// kube-proxy's configuration: iptables mode, touching only this node's addresses and no
/// sysctl it does not need.
pub(crate) fn kube_proxy_config(
    kubeconfig: &Path,
    node: &str,
    healthz_port: u16,
    metrics_port: u16,
) -> String {
    serde_json::json!({
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": kubeconfig.display().to_string()},
        "hostnameOverride": node,
        "clusterCIDR": POD_CIDR,
        "healthzBindAddress": format!("127.0.0.1:{healthz_port}"),
        "metricsBindAddress": format!("127.0.0.1:{metrics_port}"),
        "nodePortAddresses": [format!("{NODE_IP}/32")],
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "iptables": {"localhostNodePorts": false, "minSyncPeriod": "0s", "syncPeriod": "30s"}
    })
    .to_string()
}

/// Waits until containerd answers on its socket.
pub(crate) fn wait_for_socket(path: &Path, timeout: Duration) -> Result<(), DevClusterError> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(DevClusterError::Node(format!(
        "containerd did not open {} within {timeout:?}",
        path.display()
    )))
}

/// Makes the node's directories.
pub(crate) fn make_dirs(dir: &Path) -> io::Result<()> {
    for sub in [
        "containerd/root",
        "containerd/state",
        "containerd/tmp",
        "containerd/opt",
        "cni/net.d",
        "cni/ipam",
        "kubelet",
        "kubelet-certs",
        "pod-logs",
        "cdi",
    ] {
        fs::create_dir_all(dir.join(sub))?;
    }
    fs::write(dir.join("resolv.conf"), "")?;
    Ok(())
}

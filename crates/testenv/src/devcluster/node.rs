//! A real node beside kwok's simulated ones: containerd 2.x with runc and the CNI plugins
//! (bridge, host-local, loopback, portmap), the kubelet and kube-proxy — all built from their
//! pinned Go modules except runc, which comes from Debian — running this project's images.
//!
//! Everything the node makes stays inside this machine: the node's address is a second address
//! of the loopback interface, pods live on a local bridge, Services in kube-proxy's iptables
//! rules. The kubelet's
//! cgroups (and containerd's shims) live under one cgroup root of their own, so stopping the
//! node finds and ends every process it started, even after a crash of the test that started
//! it: what a node leaves behind is recorded in [`STATE_DIR`] and cleaned up by the next start.
//! One real node runs on a machine at a time (an exclusive lock on [`STATE_DIR`]).

use std::fs;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{DevClusterError, io_err};

mod config;
pub(crate) use config::*;

/// The node's address (a second address of `lo`, local to this machine and reachable from the
/// pods' bridge): the API server listens and advertises here, so pods reach it through the
/// `kubernetes` Service.
pub const NODE_IP: &str = "10.254.0.1";
/// Pod addresses of the real node (kwok's simulated pods use 10.244.0.0/16).
pub const POD_CIDR: &str = "10.88.0.0/24";
/// Where the lock and the record of the running node live.
pub const STATE_DIR: &str = "/run/offload-devcluster";
const BRIDGE: &str = "offload-br0";
/// cgroup v1 hierarchies the node's processes are created in (and cleaned from).
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// What a node leaves on the machine, recorded so a later start can remove it after a crash.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Footprint {
    /// The node's working directory (mounts under it are removed).
    pub dir: PathBuf,
    /// The cgroup (in every hierarchy) the kubelet's pods and containerd's shims live under.
    pub cgroup: String,
    /// The kube-proxy binary, to clean its iptables rules.
    pub kube_proxy: PathBuf,
}

/// The lock held for as long as a real node exists on this machine.
pub(crate) struct NodeLock {
    file: fs::File,
}

impl NodeLock {
    /// Takes the machine's node lock, waiting up to `timeout` for another node to stop.
    pub(crate) fn acquire(timeout: Duration) -> Result<NodeLock, DevClusterError> {
        fs::create_dir_all(STATE_DIR).map_err(io_err(format!("creating {STATE_DIR}")))?;
        let path = Path::new(STATE_DIR).join("node.lock");
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io_err(format!("opening {}", path.display())))?;
        let start = Instant::now();
        loop {
            // SAFETY: flock on a file descriptor we own.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Ok(NodeLock { file });
            }
            if start.elapsed() > timeout {
                return Err(DevClusterError::Node(format!(
                    "another real node holds {} for more than {timeout:?}",
                    path.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for NodeLock {
    fn drop(&mut self) {
        // SAFETY: unlocking our own descriptor; closing it would release the lock anyway.
        unsafe {
            libc::flock(self.file.as_raw_fd(), libc::LOCK_UN);
        }
    }
}

fn footprint_file() -> PathBuf {
    Path::new(STATE_DIR).join("node.json")
}

/// Runs a command that must succeed; its output is in the error.
pub(crate) fn run(cmd: &mut Command, what: &str) -> Result<String, DevClusterError> {
    let out = cmd.output().map_err(io_err(format!("running {what}")))?;
    if !out.status.success() {
        return Err(DevClusterError::Node(format!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Checks what the node needs from the machine, with a message that says what to install.
pub(crate) fn check_machine() -> Result<(), DevClusterError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(DevClusterError::Node(
            "a real node needs root (namespaces, mounts, cgroups, iptables); the demo runs without one with --out-of-cluster".into(),
        ));
    }
    for (tool, package) in [
        ("runc", "runc"),
        ("iptables", "iptables"),
        ("ip", "iproute2"),
    ] {
        if !Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return Err(DevClusterError::Node(format!(
                "{tool} is not installed: apt-get install {package}"
            )));
        }
    }
    if !Path::new(CGROUP_ROOT).join("pids").is_dir() {
        return Err(DevClusterError::Node(format!(
            "no cgroup v1 pids hierarchy under {CGROUP_ROOT}"
        )));
    }
    Ok(())
}

/// Sets up the node's address. Called before the API server starts, which listens on it.
pub(crate) fn create_node_address() -> Result<(), DevClusterError> {
    remove_node_address();
    run(
        Command::new("ip").args(["addr", "add", &format!("{NODE_IP}/32"), "dev", "lo"]),
        "adding the node's address to lo",
    )?;
    Ok(())
}

fn remove_node_address() {
    let _ = Command::new("ip")
        .args(["addr", "del", &format!("{NODE_IP}/32"), "dev", "lo"])
        .output();
}

/// The cgroup v1 hierarchies mounted here (`cpu`, `memory`, `pids`, …, and `systemd`).
fn hierarchies() -> Vec<PathBuf> {
    fs::read_dir(CGROUP_ROOT)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.join("cgroup.procs").exists())
                .collect()
        })
        .unwrap_or_default()
}

/// Creates the node's cgroup in every hierarchy (the kubelet requires its cgroup root to exist;
/// a new cpuset cgroup needs its CPUs and memory nodes before it can hold a process).
pub(crate) fn create_cgroup(name: &str) -> Result<(), DevClusterError> {
    for hierarchy in hierarchies() {
        let dir = hierarchy.join(name);
        fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
        if hierarchy.ends_with("cpuset") {
            for file in ["cpuset.cpus", "cpuset.mems"] {
                let parent = fs::read_to_string(hierarchy.join(file))
                    .map_err(io_err(format!("reading the root {file}")))?;
                fs::write(dir.join(file), parent.trim())
                    .map_err(io_err(format!("writing {}", dir.join(file).display())))?;
            }
        }
    }
    Ok(())
}

/// Moves a process into the node's `runtime` cgroup in the pids hierarchy, so its children
/// (containerd's shims) are found by [`clean_up`].
pub(crate) fn adopt(cgroup: &str, pid: u32) -> Result<(), DevClusterError> {
    let dir = Path::new(CGROUP_ROOT)
        .join("pids")
        .join(cgroup)
        .join("runtime");
    fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
    fs::write(dir.join("cgroup.procs"), pid.to_string())
        .map_err(io_err(format!("moving pid {pid} into {}", dir.display())))
}

/// Records what a node is about to leave on the machine.
pub(crate) fn record(footprint: &Footprint) -> Result<(), DevClusterError> {
    let text =
        serde_json::to_string(footprint).map_err(|e| DevClusterError::Node(e.to_string()))?;
    fs::write(footprint_file(), text).map_err(io_err("recording the node's footprint"))
}

/// Removes what a node left behind according to the record, if there is one (a crashed run).
pub(crate) fn clean_up_recorded() {
    let Ok(text) = fs::read_to_string(footprint_file()) else {
        return;
    };
    if let Ok(footprint) = serde_json::from_str::<Footprint>(&text) {
        eprintln!(
            "removing what an earlier real node left behind ({})",
            footprint.dir.display()
        );
        clean_up(&footprint);
    }
}

/// Every process in a cgroup and its descendants (pids hierarchy).
fn processes_under(cgroup: &Path) -> Vec<i32> {
    let mut out = Vec::new();
    let mut stack = vec![cgroup.to_path_buf()];
    while let Some(dir) = stack.pop() {
        if let Ok(text) = fs::read_to_string(dir.join("cgroup.procs")) {
            out.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
        }
        if let Ok(entries) = fs::read_dir(&dir) {
            stack.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
        }
    }
    out
}

/// Removes a cgroup tree, deepest first.
fn remove_cgroup_tree(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for child in entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()) {
            remove_cgroup_tree(&child);
        }
    }
    let _ = fs::remove_dir(dir);
}

/// Mount points under `dir`, deepest first.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(text) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut mounts: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        // mountinfo escapes spaces and the like as octal; our paths have none.
        .map(PathBuf::from)
        .filter(|p| p.starts_with(dir))
        .collect();
    mounts.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    mounts
}

/// Ends every process the node started, unmounts what it mounted, removes its cgroups, its
/// network devices and kube-proxy's rules, and forgets the record.
pub(crate) fn clean_up(footprint: &Footprint) {
    let pids_root = Path::new(CGROUP_ROOT).join("pids").join(&footprint.cgroup);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pids = processes_under(&pids_root);
        if pids.is_empty() || Instant::now() > deadline {
            break;
        }
        for pid in pids {
            // SAFETY: signalling a process of the node's own cgroup.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for mount in mounts_under(&footprint.dir) {
        let Ok(c) = std::ffi::CString::new(mount.as_os_str().as_encoded_bytes()) else {
            continue;
        };
        // SAFETY: a NUL-terminated path; a lazy unmount of our own mount point.
        unsafe {
            libc::umount2(c.as_ptr(), libc::MNT_DETACH);
        }
    }
    for hierarchy in hierarchies() {
        remove_cgroup_tree(&hierarchy.join(&footprint.cgroup));
    }
    if footprint.kube_proxy.is_file() {
        let _ = Command::new(&footprint.kube_proxy)
            .args(["--cleanup", "--v=0"])
            .output();
    }
    let _ = Command::new("ip").args(["link", "del", BRIDGE]).output();
    remove_node_address();
    clear_device_plugins();
    let _ = fs::remove_file(footprint_file());
}

/// The device-plugin directory, fixed by the kubelet whatever its root dir.
const DEVICE_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";

/// Empties the kubelet's device-plugin directory: its checkpoint would otherwise carry the
/// resources a stand-in plugin registered into the next node (which then advertises them as
/// present and unallocatable, overriding a test's own capacity).
fn clear_device_plugins() {
    if let Ok(entries) = fs::read_dir(DEVICE_PLUGIN_DIR) {
        for e in entries.flatten() {
            let _ = fs::remove_file(e.path());
        }
    }
}

/// The archives `hack/images.sh` writes, and the references they carry.
pub mod images {
    use std::path::PathBuf;

    use crate::devcluster::repo_root;

    /// The tag `hack/images.sh` gives by default: the workspace version.
    pub const TAG: &str = env!("CARGO_PKG_VERSION");

    /// `target/images/<name>.tar`.
    pub fn archive(name: &str) -> PathBuf {
        repo_root()
            .join("target/images")
            .join(format!("{name}.tar"))
    }

    /// `localhost/<name>:<TAG>`.
    pub fn reference(name: &str) -> String {
        format!("localhost/{name}:{TAG}")
    }

    /// The images the real node imports at start, the sandbox image first.
    pub const ALL: [&str; 3] = ["offload-pause", "offload-agent", "offload-operator"];
}

impl super::DevCluster {
    /// Starts containerd, imports the images, and starts the kubelet and kube-proxy; returns
    /// once the node is Ready.
    pub(super) async fn start_real_node(&mut self) -> Result<(), DevClusterError> {
        let Some(node) = self.node.as_ref() else {
            return Ok(());
        };
        let dir = node.footprint.dir.clone();
        let cgroup = node.footprint.cgroup.clone();
        let bins = node.bin_dir.clone();
        for name in images::ALL {
            if !images::archive(name).is_file() {
                return Err(DevClusterError::Node(format!(
                    "{} is missing: build the images first (hack/images.sh)",
                    images::archive(name).display()
                )));
            }
        }
        make_dirs(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
        clear_device_plugins();
        create_cgroup(&cgroup)?;
        let runc = run(
            Command::new("sh").args(["-c", "command -v runc"]),
            "finding runc",
        )?
        .trim()
        .to_string();

        self.start_containerd(&dir, &cgroup, &bins, &runc)?;
        self.start_kubelet(&dir, &cgroup, &bins)?;
        self.start_kube_proxy(&dir, &bins)?;
        self.wait_node_ready(super::REAL_NODE, Duration::from_secs(120))
            .await
    }

    /// containerd, in the node's cgroup so that its shims are found at clean-up, with the
    /// images imported.
    fn start_containerd(
        &mut self,
        dir: &Path,
        cgroup: &str,
        bins: &Path,
        runc: &str,
    ) -> Result<(), DevClusterError> {
        let config = dir.join("containerd/config.toml");
        fs::write(
            &config,
            containerd_config(dir, bins, runc, &images::reference("offload-pause")),
        )
        .map_err(io_err("writing containerd's configuration"))?;
        fs::write(dir.join("cni/net.d/10-offload.conflist"), cni_config(dir))
            .map_err(io_err("writing the CNI configuration"))?;
        let path = std::env::var("PATH").unwrap_or_default();
        self.launch_node(
            "containerd",
            &bins.join("containerd"),
            &[format!("--config={}", config.display())],
            // containerd finds its shim on PATH.
            &[("PATH", format!("{}:{path}", bins.display()))],
        )?;
        if let Some(p) = self.procs.last() {
            adopt(cgroup, p.child.id())?;
        }
        let socket = containerd_socket(dir);
        wait_for_socket(&socket, Duration::from_secs(30))?;
        for name in images::ALL {
            run(
                Command::new(bins.join("ctr"))
                    .arg("--address")
                    .arg(&socket)
                    .args(["--namespace", "k8s.io", "images", "import", "--local"])
                    .arg(images::archive(name)),
                &format!("importing {name} into containerd"),
            )?;
        }

        Ok(())
    }

    /// The kubelet: a client certificate for `system:node:<name>` (the Node authorizer and
    /// NodeRestriction apply to it), its configuration, and its own directories.
    fn start_kubelet(
        &mut self,
        dir: &Path,
        cgroup: &str,
        bins: &Path,
    ) -> Result<(), DevClusterError> {
        use super::{YEAR, pki};
        let node_name = super::REAL_NODE;
        let kubelet_cert = pki::issue_client(
            &self.ca,
            &format!("system:node:{node_name}"),
            &["system:nodes"],
            YEAR,
        )?;
        let kubelet_kc = self.write_kubeconfig(
            "kubelet.kubeconfig",
            &format!("system:node:{node_name}"),
            &kubelet_cert,
        )?;
        let ca_file = self.root.join("ca.crt");
        let kubelet_config_file = dir.join("kubelet-config.json");
        fs::write(
            &kubelet_config_file,
            kubelet_config(&KubeletSettings {
                dir,
                cgroup,
                port: super::free_port()?,
                healthz_port: super::free_port()?,
                client_ca: &ca_file,
            }),
        )
        .map_err(io_err("writing the kubelet's configuration"))?;
        self.launch_node(
            "kubelet",
            &bins.join("kubelet"),
            &[
                format!("--config={}", kubelet_config_file.display()),
                format!("--kubeconfig={}", kubelet_kc.display()),
                format!("--root-dir={}", dir.join("kubelet").display()),
                format!("--cert-dir={}", dir.join("kubelet-certs").display()),
                format!("--hostname-override={node_name}"),
                format!("--node-ip={NODE_IP}"),
                "--v=1".to_string(),
            ],
            &[],
        )?;

        Ok(())
    }

    /// kube-proxy, as system:kube-proxy (bound to system:node-proxier by default).
    fn start_kube_proxy(&mut self, dir: &Path, bins: &Path) -> Result<(), DevClusterError> {
        use super::{YEAR, pki};
        let node_name = super::REAL_NODE;
        let proxy_cert = pki::issue_client(&self.ca, "system:kube-proxy", &[], YEAR)?;
        let proxy_kc =
            self.write_kubeconfig("kube-proxy.kubeconfig", "system:kube-proxy", &proxy_cert)?;
        let proxy_config = dir.join("kube-proxy-config.json");
        fs::write(
            &proxy_config,
            kube_proxy_config(
                &proxy_kc,
                node_name,
                super::free_port()?,
                super::free_port()?,
            ),
        )
        .map_err(io_err("writing kube-proxy's configuration"))?;
        self.launch_node(
            "kube-proxy",
            &bins.join("kube-proxy"),
            &[
                format!("--config={}", proxy_config.display()),
                "--v=1".to_string(),
            ],
            &[],
        )?;
        Ok(())
    }

    /// A `ctr` command bound to the real node's containerd, namespace `k8s.io` (the kubelet's).
    pub fn ctr(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(
            self.node
                .as_ref()
                .map_or_else(PathBuf::new, |n| n.bin_dir.join("ctr")),
        );
        if let Some(node) = &self.node {
            cmd.arg("--address")
                .arg(containerd_socket(&node.footprint.dir))
                .args(["--namespace", "k8s.io"]);
        }
        cmd.args(args);
        cmd
    }

    /// Imports an OCI or Docker archive into the real node's containerd (the kubelet's
    /// namespace), as a registry pull would land it: pods then run it with
    /// `imagePullPolicy: IfNotPresent`.
    pub fn import_image(&self, archive: &Path) -> Result<(), DevClusterError> {
        if self.node.is_none() {
            return Err(DevClusterError::Node(
                "importing an image needs the real node (ClusterOptions::with_real_node)".into(),
            ));
        }
        run(
            self.ctr(&["images", "import", "--local"]).arg(archive),
            &format!("importing {} into containerd", archive.display()),
        )?;
        Ok(())
    }

    /// Waits until the node reports Ready (or a node process exits).
    async fn wait_node_ready(
        &mut self,
        name: &str,
        timeout: Duration,
    ) -> Result<(), DevClusterError> {
        use k8s_openapi::api::core::v1::Node;
        let client = self.client().await?;
        let nodes: kube::Api<Node> = kube::Api::all(client);
        let start = Instant::now();
        let mut delay = Duration::from_millis(100);
        loop {
            if let Ok(Some(node)) = nodes.get_opt(name).await
                && node
                    .status
                    .and_then(|s| s.conditions)
                    .into_iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            {
                return Ok(());
            }
            if let Some(exited) = self.exited() {
                return Err(self.not_ready(exited, start.elapsed()));
            }
            if start.elapsed() > timeout {
                return Err(self.not_ready("kubelet", start.elapsed()));
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(1));
        }
    }

    /// Stops the node's own processes (kube-proxy, kubelet), then everything in its cgroup
    /// (containerd, its shims, the containers), and removes what it left on the machine.
    pub(super) fn stop_real_node(&mut self) {
        let Some(node) = self.node.take() else {
            return;
        };
        self.stop_named(&["kube-proxy", "kubelet"]);
        clean_up(&node.footprint);
        self.stop_named(&["containerd"]);
    }
}

//! A local Kubernetes control plane made of the real upstream binaries (etcd, kube-apiserver,
//! and optionally kube-controller-manager, kube-scheduler and kwok), for integration tests and
//! the local demo.
//!
//! The binaries come from `hack/k8s/build.sh`, which builds them from their Go modules into a
//! cache outside the clone. Everything else (certificates, kubeconfig, data) lives in a temporary
//! directory that is removed on [`DevCluster::stop`]. Child processes are started from one
//! long-lived thread with `PR_SET_PDEATHSIG`, so they die with the process that started them
//! even when a test binary exits without running destructors.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use offload_operator::ops::certs::{self, CertAuthority};

use crate::pki;

mod binaries;
mod components;
mod kubeconfig;
pub mod node;
mod process;

pub use binaries::{ensure_binaries, ensure_job_kinds, ensure_kueue, repo_root};
pub use process::free_port;
use process::spawn;

/// What to start beside etcd and kube-apiserver.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClusterOptions {
    /// kube-controller-manager: Jobs create Pods, service accounts get tokens, GC runs.
    pub controller_manager: bool,
    /// kube-scheduler: Pods get bound to nodes.
    pub scheduler: bool,
    /// kwok: simulated nodes go Ready and their pods Running, without a kubelet.
    pub kwok: bool,
    /// A real node (containerd, runc, CNI, kubelet, kube-proxy) that runs this project's
    /// images, beside kwok's simulated nodes; see [`node`]. Needs root and the images from
    /// `hack/images.sh`.
    pub real_node: bool,
}

impl ClusterOptions {
    /// Controller-manager, scheduler and kwok (every simulated part).
    pub fn full() -> Self {
        ClusterOptions {
            controller_manager: true,
            scheduler: true,
            kwok: true,
            real_node: false,
        }
    }

    /// Everything, with a real node that runs containers.
    pub fn with_real_node() -> Self {
        ClusterOptions {
            real_node: true,
            ..ClusterOptions::full()
        }
    }
}

/// Name of the real node.
pub const REAL_NODE: &str = "devnode";

/// The local control plane could not be started or used.
#[derive(Debug, thiserror::Error)]
pub enum DevClusterError {
    /// A binary is missing and could not be built.
    #[error("control-plane binaries are missing: {0}")]
    Binaries(String),
    /// File or process I/O failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// Certificates could not be made.
    #[error(transparent)]
    Certs(#[from] certs::CertError),
    /// Keys could not be made.
    #[error(transparent)]
    Keys(#[from] pki::KeyError),
    /// A component did not become ready in time.
    #[error("{component} was not ready after {waited:?}; its log is at {log}:\n{tail}")]
    NotReady {
        /// Component name.
        component: &'static str,
        /// How long we waited.
        waited: Duration,
        /// Log path.
        log: String,
        /// Last lines of the log.
        tail: String,
    },
    /// The kubeconfig could not be turned into a client.
    #[error("kube client: {0}")]
    Client(String),
    /// The real node could not be set up.
    #[error("real node: {0}")]
    Node(String),
}

impl DevClusterError {
    /// Whether a component stopped because its port was taken ("address already in use").
    pub fn lost_a_port(&self) -> bool {
        matches!(self, DevClusterError::NotReady { tail, .. } if tail.contains("address already in use"))
    }
}

pub(crate) fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> DevClusterError {
    let what = what.into();
    move |source| DevClusterError::Io { what, source }
}

struct Proc {
    name: &'static str,
    child: Child,
    log: PathBuf,
    /// How it was started, so [`DevCluster::restart_control_plane`] can start it again.
    bin: PathBuf,
    args: Vec<String>,
    env: Vec<(&'static str, String)>,
}

/// A running local control plane.
pub struct DevCluster {
    dir: Option<tempfile::TempDir>,
    root: PathBuf,
    procs: Vec<Proc>,
    bin_dir: PathBuf,
    /// Admin kubeconfig (user `admin`, group `system:masters`).
    pub kubeconfig: PathBuf,
    /// API server URL.
    pub server: String,
    /// The cluster CA in PEM, for webhook configurations and clients.
    pub ca_pem: String,
    ca: CertAuthority,
    options: ClusterOptions,
    node: Option<RealNode>,
}

/// The real node's state while it runs.
struct RealNode {
    footprint: node::Footprint,
    bin_dir: PathBuf,
    _lock: node::NodeLock,
}

impl std::fmt::Debug for DevCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevCluster")
            .field("server", &self.server)
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);
const DIR_PREFIX: &str = "offload-devcluster-";
const OWNER_FILE: &str = "owner.pid";

/// Removes cluster directories left by processes that no longer exist.
fn remove_stale_dirs() {
    let Ok(entries) = fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let is_ours = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(DIR_PREFIX));
        let owner = fs::read_to_string(path.join(OWNER_FILE))
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok());
        // SAFETY: signal 0 only checks whether the process exists.
        if is_ours
            && let Some(pid) = owner
            && unsafe { libc::kill(pid, 0) } != 0
        {
            let _ = fs::remove_dir_all(&path);
        }
    }
}

impl DevCluster {
    /// Starts etcd and kube-apiserver (and whatever `options` asks for) and waits until the API
    /// server answers `/readyz`.
    ///
    /// A component that could not bind its port (taken between [`free_port`]'s check and the
    /// component's bind, by a test process beside this one) is no fault of the cluster: the
    /// start is tried again on new ports, up to three times in all.
    pub async fn start(options: ClusterOptions) -> Result<DevCluster, DevClusterError> {
        let mut tries = 1;
        loop {
            match Self::start_once(options).await {
                Err(e) if tries < 3 && e.lost_a_port() => {
                    eprintln!("a component lost its port to another process, starting again: {e}");
                    tries += 1;
                }
                result => return result,
            }
        }
    }

    async fn start_once(options: ClusterOptions) -> Result<DevCluster, DevClusterError> {
        let bin_dir = ensure_binaries()?;
        for bin in ["etcd", "kube-apiserver", "kubectl"] {
            if !bin_dir.join(bin).is_file() {
                return Err(DevClusterError::Binaries(format!(
                    "{} has no {bin}; run hack/k8s/build.sh",
                    bin_dir.display()
                )));
            }
        }
        remove_stale_dirs();
        let dir = tempfile::Builder::new()
            .prefix(DIR_PREFIX)
            .tempdir()
            .map_err(io_err("creating the cluster directory"))?;
        let root = dir.path().to_path_buf();
        // A cluster kept in a static (one per test binary) is never dropped; its directory is
        // removed by the next start once this process is gone.
        fs::write(root.join(OWNER_FILE), std::process::id().to_string())
            .map_err(io_err("writing the owner file"))?;
        let ca = CertAuthority::generate("offload-devcluster-ca", YEAR)?;
        let mut cluster = DevCluster {
            dir: Some(dir),
            root: root.clone(),
            procs: Vec::new(),
            bin_dir,
            kubeconfig: root.join("admin.kubeconfig"),
            server: String::new(),
            ca_pem: ca.cert.cert_pem.clone(),
            ca,
            options,
            node: None,
        };
        if options.real_node {
            node::check_machine()?;
            let lock = node::NodeLock::acquire(Duration::from_secs(600))?;
            node::clean_up_recorded();
            let node_bins = binaries::ensure_node_binaries()?;
            let footprint = node::Footprint {
                dir: root.join("node"),
                cgroup: format!("offload-devnode-{}", std::process::id()),
                kube_proxy: node_bins.join("kube-proxy"),
            };
            node::record(&footprint)?;
            node::create_node_address()?;
            cluster.node = Some(RealNode {
                footprint,
                bin_dir: node_bins,
                _lock: lock,
            });
        }
        cluster.start_etcd_and_apiserver().await?;
        let mut serving = Vec::new();
        if options.controller_manager {
            serving.push((
                "kube-controller-manager",
                cluster.start_controller_manager()?,
            ));
        }
        if options.scheduler {
            serving.push(("kube-scheduler", cluster.start_scheduler()?));
        }
        if options.kwok {
            serving.push(("kwok", cluster.start_kwok()?));
        }
        cluster
            .wait_listening(&serving, Duration::from_secs(60))
            .await?;
        if options.real_node {
            cluster.start_real_node().await?;
        }
        Ok(cluster)
    }

    fn write(&self, name: &str, contents: &str) -> Result<PathBuf, DevClusterError> {
        let path = self.root.join(name);
        fs::write(&path, contents).map_err(io_err(format!("writing {}", path.display())))?;
        Ok(path)
    }

    fn launch(&mut self, name: &'static str, args: &[String]) -> Result<(), DevClusterError> {
        let bin = self.bin_dir.join(name);
        self.launch_from(name, &bin, args)
    }

    fn launch_from(
        &mut self,
        name: &'static str,
        bin: &Path,
        args: &[String],
    ) -> Result<(), DevClusterError> {
        self.launch_node(name, bin, args, &[])
    }

    /// Starts `bin` as component `name`, with extra environment.
    fn launch_node(
        &mut self,
        name: &'static str,
        bin: &Path,
        args: &[String],
        env: &[(&'static str, String)],
    ) -> Result<(), DevClusterError> {
        let log = self.root.join(format!("{name}.log"));
        // Appending: a restarted component keeps the log of its first life above its second.
        let file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(io_err(format!("creating {}", log.display())))?;
        let err = file.try_clone().map_err(io_err("cloning a log handle"))?;
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::from(file))
            .stderr(Stdio::from(err))
            .current_dir(&self.root);
        let child = spawn(cmd).map_err(io_err(format!("starting {name}")))?;
        self.procs.push(Proc {
            name,
            child,
            log,
            bin: bin.to_path_buf(),
            args: args.to_vec(),
            env: env.to_vec(),
        });
        Ok(())
    }

    /// Waits until `/readyz` answers ok, or the component's process exits.
    async fn wait_ready(
        &mut self,
        component: &'static str,
        timeout: Duration,
    ) -> Result<(), DevClusterError> {
        let client = self.client().await?;
        self.poll_ready(timeout, async || {
            let req = http::Request::get("/readyz").body(Vec::new());
            if let Ok(req) = req
                && let Ok(body) = client.request_text(req).await
                && body.trim() == "ok"
            {
                return None;
            }
            Some(component)
        })
        .await
    }

    /// Polls `pending` (the component still waited on, `None` once all are ready) until it is
    /// `None`; a component's process that exits first, or `timeout`, is an error with the end
    /// of that component's log.
    pub(super) async fn poll_ready(
        &mut self,
        timeout: Duration,
        mut pending: impl AsyncFnMut() -> Option<&'static str>,
    ) -> Result<(), DevClusterError> {
        let start = Instant::now();
        let mut delay = Duration::from_millis(50);
        loop {
            let Some(waiting_on) = pending().await else {
                return Ok(());
            };
            if let Some(exited) = self.exited() {
                return Err(self.not_ready(exited, start.elapsed()));
            }
            if start.elapsed() > timeout {
                return Err(self.not_ready(waiting_on, start.elapsed()));
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_millis(500));
        }
    }

    fn exited(&mut self) -> Option<&'static str> {
        self.procs
            .iter_mut()
            .find_map(|p| matches!(p.child.try_wait(), Ok(Some(_))).then_some(p.name))
    }

    fn not_ready(&self, component: &'static str, waited: Duration) -> DevClusterError {
        let log = self
            .procs
            .iter()
            .find(|p| p.name == component)
            .map(|p| p.log.clone())
            .unwrap_or_default();
        let text = fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(20).collect();
        DevClusterError::NotReady {
            component,
            waited,
            log: log.display().to_string(),
            tail: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
        }
    }

    /// A kube client for the admin user.
    pub async fn client(&self) -> Result<Client, DevClusterError> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)
            .map_err(|e| DevClusterError::Client(e.to_string()))?;
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| DevClusterError::Client(e.to_string()))?;
        Client::try_from(config).map_err(|e| DevClusterError::Client(e.to_string()))
    }

    /// A `kubectl` command bound to this cluster.
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new(self.bin_dir.join("kubectl"));
        cmd.env("KUBECONFIG", &self.kubeconfig);
        cmd
    }

    /// A `helm` command bound to this cluster.
    pub fn helm(&self) -> Command {
        let mut cmd = Command::new(self.bin_dir.join("helm"));
        cmd.env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CACHE_HOME", self.root.join("helm/cache"))
            .env("HELM_CONFIG_HOME", self.root.join("helm/config"))
            .env("HELM_DATA_HOME", self.root.join("helm/data"));
        cmd
    }

    /// Directory of the upstream binaries.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// The cluster's working directory (logs, certificates).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The real node's kubelet root directory (its `pod-resources` socket is below it); `None`
    /// without a real node.
    pub fn kubelet_dir(&self) -> Option<PathBuf> {
        self.node.as_ref().map(|n| n.footprint.dir.join("kubelet"))
    }

    /// Where the real node's containerd reads CDI spec files (a DRA plugin writes them there);
    /// `None` without a real node.
    pub fn cdi_dir(&self) -> Option<PathBuf> {
        self.node.as_ref().map(|n| node::cdi_dir(&n.footprint.dir))
    }

    /// The real node's binaries (kubelet, containerd, the DRA plugin stand-in); `None` without
    /// a real node.
    pub fn node_bin_dir(&self) -> Option<&Path> {
        self.node.as_ref().map(|n| n.bin_dir.as_path())
    }

    /// The real node's cgroup (its kubelet's `--cgroup-root`, in every v1 hierarchy under
    /// `/sys/fs/cgroup`); `None` without a real node.
    pub fn node_cgroup(&self) -> Option<&str> {
        self.node.as_ref().map(|n| n.footprint.cgroup.as_str())
    }

    /// The CA that signed the API server's certificate; usable to issue more certificates.
    pub fn ca(&self) -> &CertAuthority {
        &self.ca
    }

    /// What was started.
    pub fn options(&self) -> ClusterOptions {
        self.options
    }

    /// The process id of each running component (etcd, kube-apiserver, kwok, …), for
    /// benchmarks that read their CPU time.
    pub fn pids(&self) -> BTreeMap<&'static str, u32> {
        self.procs.iter().map(|p| (p.name, p.child.id())).collect()
    }

    /// The components that are no longer running (their process gone or a zombie), each with
    /// the last lines of its log: what a test that timed out waiting on the cluster reports.
    pub fn exited_components(&self) -> Vec<(&'static str, String)> {
        self.procs
            .iter()
            .filter(|p| {
                let stat = fs::read_to_string(format!("/proc/{}/stat", p.child.id()));
                // The state follows the command's closing parenthesis: `Z` or `X` is gone.
                stat.map_or(true, |s| {
                    s.rsplit_once(") ")
                        .is_none_or(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X'))
                })
            })
            .map(|p| {
                let text = fs::read_to_string(&p.log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(15).collect();
                (
                    p.name,
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
                )
            })
            .collect()
    }

    /// Resident memory of each running component, in KiB (from `/proc`), for benchmarks.
    pub fn memory_kib(&self) -> BTreeMap<&'static str, u64> {
        self.procs
            .iter()
            .filter_map(|p| {
                let status = fs::read_to_string(format!("/proc/{}/status", p.child.id())).ok()?;
                let rss = status
                    .lines()
                    .find(|l| l.starts_with("VmRSS:"))?
                    .split_whitespace()
                    .nth(1)?
                    .parse()
                    .ok()?;
                Some((p.name, rss))
            })
            .collect()
    }

    /// Writes a kubeconfig for a client certificate into the cluster directory.
    fn write_kubeconfig(
        &self,
        file: &str,
        user: &str,
        cert: &certs::IssuedCert,
    ) -> Result<PathBuf, DevClusterError> {
        let config = kubeconfig::client_kubeconfig(
            &self.server,
            &self.ca.cert.cert_pem,
            user,
            &cert.cert_pem,
            &cert.key_pem,
        );
        let yaml = serde_saphyr::to_string(&config).map_err(|e| DevClusterError::Io {
            what: format!("writing {file}"),
            source: io::Error::other(e.to_string()),
        })?;
        self.write(file, &yaml)
    }

    /// Restarts etcd and kube-apiserver the way an outage does: both killed with SIGKILL, then
    /// started again with the same data, ports and certificates. Returns when the API server
    /// answers `/readyz` again. Clients and watches see their connections drop and must recover
    /// on their own, which is what a caller tests.
    pub async fn restart_control_plane(&mut self) -> Result<(), DevClusterError> {
        const NAMES: [&str; 2] = ["etcd", "kube-apiserver"];
        let (stopped, keep): (Vec<Proc>, Vec<Proc>) = std::mem::take(&mut self.procs)
            .into_iter()
            .partition(|p| NAMES.contains(&p.name));
        self.procs = keep;
        let mut again = Vec::new();
        for mut p in stopped {
            let _ = p.child.kill();
            let _ = p.child.wait();
            again.push((p.name, p.bin, p.args, p.env));
        }
        // etcd first, as at start-up.
        again.sort_by_key(|(name, ..)| NAMES.iter().position(|n| n == name));
        for (name, bin, args, env) in again {
            self.launch_node(name, &bin, &args, &env)?;
        }
        self.wait_ready("kube-apiserver", Duration::from_secs(90))
            .await
    }

    /// Stops the named components (SIGTERM, then SIGKILL after a grace period).
    fn stop_named(&mut self, names: &[&str]) {
        let (stopping, keep): (Vec<Proc>, Vec<Proc>) = std::mem::take(&mut self.procs)
            .into_iter()
            .partition(|p| names.contains(&p.name));
        self.procs = keep;
        stop_all(stopping);
    }

    /// Stops every component (SIGTERM, then SIGKILL after a grace period), the real node first,
    /// and removes the working directory unless `OFFLOAD_KEEP_CLUSTER_DIR` is set.
    pub fn stop(&mut self) {
        self.stop_real_node();
        stop_all(std::mem::take(&mut self.procs));
        if let Some(dir) = self.dir.take()
            && std::env::var_os("OFFLOAD_KEEP_CLUSTER_DIR").is_some()
        {
            let _ = dir.keep();
        }
    }
}

/// Stops processes, the last started first: SIGTERM, then SIGKILL after a grace period.
fn stop_all(mut procs: Vec<Proc>) {
    {
        for p in procs.iter().rev() {
            // SAFETY: sending a signal to our own child by pid.
            unsafe {
                libc::kill(p.child.id() as libc::pid_t, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for p in procs.iter_mut().rev() {
            loop {
                match p.child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() > deadline => {
                        let _ = p.child.kill();
                        let _ = p.child.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
    }
}

impl Drop for DevCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

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
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use kube::config::{
    AuthInfo, Cluster, Context, KubeConfigOptions, Kubeconfig, NamedAuthInfo, NamedCluster,
    NamedContext,
};
use kube::{Client, Config};
use offload_operator::certs::{self, CertAuthority};

use crate::pki;

/// What to start beside etcd and kube-apiserver.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClusterOptions {
    /// kube-controller-manager: Jobs create Pods, service accounts get tokens, GC runs.
    pub controller_manager: bool,
    /// kube-scheduler: Pods get bound to nodes.
    pub scheduler: bool,
    /// kwok: simulated nodes go Ready and their pods Running, without a kubelet.
    pub kwok: bool,
}

impl ClusterOptions {
    /// Everything: controller-manager, scheduler and kwok.
    pub fn full() -> Self {
        ClusterOptions {
            controller_manager: true,
            scheduler: true,
            kwok: true,
        }
    }
}

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
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> DevClusterError {
    let what = what.into();
    move |source| DevClusterError::Io { what, source }
}

/// Where the control-plane binaries live: `$OFFLOAD_K8S_BIN_DIR`, else the cache directory
/// `hack/k8s/build.sh` builds into. Builds them (with progress on stderr) when missing.
pub fn ensure_binaries() -> Result<PathBuf, DevClusterError> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Ok(dir) = std::env::var("OFFLOAD_K8S_BIN_DIR") {
            return Ok(PathBuf::from(dir));
        }
        let script = repo_root().join("hack/k8s/build.sh");
        let out = Command::new("bash")
            .arg(&script)
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| format!("running {}: {e}", script.display()))?;
        if !out.status.success() {
            return Err(format!(
                "{} failed ({}); see its output above",
                script.display(),
                out.status
            ));
        }
        let dir = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .trim()
            .to_string();
        Ok(PathBuf::from(dir))
    })
    .clone()
    .map_err(DevClusterError::Binaries)
}

/// The repository root (this crate lives in `crates/testenv`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Spawns children from one thread that lives as long as the process, so `PR_SET_PDEATHSIG`
/// (which fires when the spawning *thread* exits) only fires when the process does.
fn spawn(mut cmd: Command) -> io::Result<Child> {
    type Job = (Command, mpsc::Sender<io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let sender = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("devcluster-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
                    unsafe {
                        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                                return Err(io::Error::last_os_error());
                            }
                            Ok(())
                        });
                    }
                    let _ = reply.send(cmd.spawn());
                }
            })
            .map(|_| ())
            .ok();
        Mutex::new(tx)
    });
    let (tx, rx) = mpsc::channel();
    let send = sender
        .lock()
        .map_err(|_| io::Error::other("spawner lock poisoned"))?
        .send((cmd, tx));
    match send {
        Ok(()) => rx
            .recv()
            .map_err(|_| io::Error::other("spawner thread is gone"))?,
        Err(mpsc::SendError((c, _))) => {
            cmd = c;
            cmd.spawn()
        }
    }
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> Result<u16, DevClusterError> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(io_err("finding a free port"))?;
    Ok(listener
        .local_addr()
        .map_err(io_err("finding a free port"))?
        .port())
}

struct Proc {
    name: &'static str,
    child: Child,
    log: PathBuf,
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
    pub async fn start(options: ClusterOptions) -> Result<DevCluster, DevClusterError> {
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
        };
        cluster.start_etcd_and_apiserver().await?;
        if options.controller_manager {
            cluster.start_controller_manager()?;
        }
        if options.scheduler {
            cluster.start_scheduler()?;
        }
        if options.kwok {
            cluster.start_kwok()?;
        }
        Ok(cluster)
    }

    fn write(&self, name: &str, contents: &str) -> Result<PathBuf, DevClusterError> {
        let path = self.root.join(name);
        fs::write(&path, contents).map_err(io_err(format!("writing {}", path.display())))?;
        Ok(path)
    }

    fn launch(&mut self, name: &'static str, args: &[String]) -> Result<(), DevClusterError> {
        let log = self.root.join(format!("{name}.log"));
        let file = fs::File::create(&log).map_err(io_err(format!("creating {}", log.display())))?;
        let err = file.try_clone().map_err(io_err("cloning a log handle"))?;
        let mut cmd = Command::new(self.bin_dir.join(name));
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(file))
            .stderr(Stdio::from(err))
            .current_dir(&self.root);
        let child = spawn(cmd).map_err(io_err(format!("starting {name}")))?;
        self.procs.push(Proc { name, child, log });
        Ok(())
    }

    async fn start_etcd_and_apiserver(&mut self) -> Result<(), DevClusterError> {
        let etcd_client = free_port()?;
        let etcd_peer = free_port()?;
        let api_port = free_port()?;
        let etcd_url = format!("http://127.0.0.1:{etcd_client}");
        self.launch(
            "etcd",
            &[
                format!("--data-dir={}", self.root.join("etcd").display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls=http://127.0.0.1:{etcd_peer}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}"),
                format!("--initial-cluster=default=http://127.0.0.1:{etcd_peer}"),
                "--unsafe-no-fsync=true".into(),
                "--log-level=warn".into(),
                "--quota-backend-bytes=8589934592".into(),
            ],
        )?;

        let serving = self.ca.issue_server(
            &[
                "127.0.0.1".into(),
                "localhost".into(),
                "kubernetes".into(),
                "kubernetes.default.svc".into(),
                "10.0.0.1".into(),
            ],
            YEAR,
        )?;
        let admin = pki::issue_client(&self.ca, "admin", &["system:masters"], YEAR)?;
        let sa_key = pki::generate_key_pem()?;
        let ca_file = self.write("ca.crt", &self.ca.cert.cert_pem)?;
        let ca_key_file = self.write("ca.key", &self.ca.cert.key_pem)?;
        let serving_cert = self.write("apiserver.crt", &serving.cert_pem)?;
        let serving_key = self.write("apiserver.key", &serving.key_pem)?;
        let sa_key_file = self.write("sa.key", &sa_key)?;
        let sa_pub_file = self.write("sa.pub", &pki::public_key_pem(&sa_key)?)?;
        self.server = format!("https://127.0.0.1:{api_port}");
        let kubeconfig = admin_kubeconfig(
            &self.server,
            &self.ca.cert.cert_pem,
            &admin.cert_pem,
            &admin.key_pem,
        );
        let yaml = serde_saphyr::to_string(&kubeconfig).map_err(|e| DevClusterError::Io {
            what: "writing the kubeconfig".into(),
            source: io::Error::other(e.to_string()),
        })?;
        fs::write(&self.kubeconfig, yaml).map_err(io_err("writing the kubeconfig"))?;
        let _ = ca_key_file;

        let d = |p: &Path| p.display().to_string();
        self.launch(
            "kube-apiserver",
            &[
                format!("--etcd-servers={etcd_url}"),
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                format!("--secure-port={api_port}"),
                format!("--tls-cert-file={}", d(&serving_cert)),
                format!("--tls-private-key-file={}", d(&serving_key)),
                format!("--client-ca-file={}", d(&ca_file)),
                format!("--service-account-key-file={}", d(&sa_pub_file)),
                format!("--service-account-signing-key-file={}", d(&sa_key_file)),
                "--service-account-issuer=https://kubernetes.default.svc".into(),
                "--api-audiences=https://kubernetes.default.svc".into(),
                "--authorization-mode=RBAC".into(),
                "--enable-admission-plugins=NamespaceLifecycle,ServiceAccount,NodeRestriction,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy,ResourceQuota".into(),
                "--service-cluster-ip-range=10.0.0.0/24".into(),
                "--allow-privileged=true".into(),
                "--enable-priority-and-fairness=false".into(),
                format!("--cert-dir={}", d(&self.root.join("apiserver-certs"))),
                "--v=1".into(),
            ],
        )?;
        self.wait_ready("kube-apiserver", Duration::from_secs(90))
            .await
    }

    /// Waits until `/readyz` answers ok, or the component's process exits.
    async fn wait_ready(
        &mut self,
        component: &'static str,
        timeout: Duration,
    ) -> Result<(), DevClusterError> {
        let start = Instant::now();
        let client = self.client().await?;
        let mut delay = Duration::from_millis(50);
        loop {
            let req = http::Request::get("/readyz").body(Vec::new());
            if let Ok(req) = req
                && let Ok(body) = client.request_text(req).await
                && body.trim() == "ok"
            {
                return Ok(());
            }
            if let Some(exited) = self.exited() {
                return Err(self.not_ready(exited, start.elapsed()));
            }
            if start.elapsed() > timeout {
                return Err(self.not_ready(component, start.elapsed()));
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

    fn start_controller_manager(&mut self) -> Result<(), DevClusterError> {
        let port = free_port()?;
        let kc = self.kubeconfig.display().to_string();
        let root = self.root.clone();
        self.launch(
            "kube-controller-manager",
            &[
                format!("--kubeconfig={kc}"),
                format!("--authentication-kubeconfig={kc}"),
                format!("--authorization-kubeconfig={kc}"),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={port}"),
                format!(
                    "--service-account-private-key-file={}",
                    root.join("sa.key").display()
                ),
                format!("--root-ca-file={}", root.join("ca.crt").display()),
                format!(
                    "--cluster-signing-cert-file={}",
                    root.join("ca.crt").display()
                ),
                format!(
                    "--cluster-signing-key-file={}",
                    root.join("ca.key").display()
                ),
                "--use-service-account-credentials=true".into(),
                "--leader-elect=false".into(),
                "--controllers=*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller,-route"
                    .into(),
                "--concurrent-job-syncs=10".into(),
                "--kube-api-qps=200".into(),
                "--kube-api-burst=400".into(),
                "--v=1".into(),
            ],
        )
    }

    fn start_scheduler(&mut self) -> Result<(), DevClusterError> {
        let port = free_port()?;
        let kc = self.kubeconfig.display().to_string();
        self.launch(
            "kube-scheduler",
            &[
                format!("--kubeconfig={kc}"),
                format!("--authentication-kubeconfig={kc}"),
                format!("--authorization-kubeconfig={kc}"),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={port}"),
                "--leader-elect=false".into(),
                "--kube-api-qps=200".into(),
                "--kube-api-burst=400".into(),
                "--v=1".into(),
            ],
        )
    }

    fn start_kwok(&mut self) -> Result<(), DevClusterError> {
        let stages = self.bin_dir.join("../kwok-stages");
        let mut configs = Vec::new();
        if let Ok(entries) = fs::read_dir(&stages) {
            let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
            files.sort();
            configs.extend(
                files
                    .into_iter()
                    .map(|p| format!("--config={}", p.display())),
            );
        }
        let port = free_port()?;
        let mut args = vec![
            format!("--kubeconfig={}", self.kubeconfig.display()),
            "--manage-all-nodes=false".into(),
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake".into(),
            "--manage-nodes-with-label-selector=".into(),
            "--node-lease-duration-seconds=40".into(),
            format!("--server-address=127.0.0.1:{port}"),
            "--cidr=10.244.0.0/16".into(),
            "--node-ip=10.244.0.1".into(),
        ];
        args.extend(configs);
        self.launch("kwok", &args)
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

    /// The CA that signed the API server's certificate; usable to issue more certificates.
    pub fn ca(&self) -> &CertAuthority {
        &self.ca
    }

    /// What was started.
    pub fn options(&self) -> ClusterOptions {
        self.options
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

    /// Stops every component (SIGTERM, then SIGKILL after a grace period) and removes the
    /// working directory unless `OFFLOAD_KEEP_CLUSTER_DIR` is set.
    pub fn stop(&mut self) {
        for p in self.procs.iter().rev() {
            // SAFETY: sending a signal to our own child by pid.
            unsafe {
                libc::kill(p.child.id() as libc::pid_t, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for p in self.procs.iter_mut().rev() {
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
        self.procs.clear();
        if let Some(dir) = self.dir.take()
            && std::env::var_os("OFFLOAD_KEEP_CLUSTER_DIR").is_some()
        {
            let _ = dir.keep();
        }
    }
}

impl Drop for DevCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The admin kubeconfig: one cluster, one user authenticated by client certificate.
fn admin_kubeconfig(server: &str, ca_pem: &str, cert_pem: &str, key_pem: &str) -> Kubeconfig {
    use base64::Engine as _;
    let b64 = |text: &str| base64::engine::general_purpose::STANDARD.encode(text);
    let name = "devcluster".to_string();
    Kubeconfig {
        clusters: vec![NamedCluster {
            name: name.clone(),
            cluster: Some(Cluster {
                server: Some(server.to_string()),
                certificate_authority_data: Some(b64(ca_pem)),
                ..Cluster::default()
            }),
            ..NamedCluster::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: "admin".to_string(),
            auth_info: Some(AuthInfo {
                client_certificate_data: Some(b64(cert_pem)),
                client_key_data: Some(secrecy::SecretString::from(b64(key_pem))),
                ..AuthInfo::default()
            }),
            ..NamedAuthInfo::default()
        }],
        contexts: vec![NamedContext {
            name: name.clone(),
            context: Some(Context {
                cluster: name.clone(),
                user: Some("admin".to_string()),
                ..Context::default()
            }),
            ..NamedContext::default()
        }],
        current_context: Some(name),
        kind: Some("Config".to_string()),
        api_version: Some("v1".to_string()),
        ..Kubeconfig::default()
    }
}

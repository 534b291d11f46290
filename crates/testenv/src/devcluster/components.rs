//! Starting the control plane's components: etcd and kube-apiserver (with the certificates,
//! the kubeconfig and, with a real node, the kubelet client and the aggregation layer), then
//! kube-controller-manager, kube-scheduler and kwok.

use super::*;

impl DevCluster {
    pub(super) async fn start_etcd_and_apiserver(&mut self) -> Result<(), DevClusterError> {
        let etcd_url = self.start_etcd()?;
        let api_port = free_port()?;

        let serving = self.ca.issue_server(
            &[
                "127.0.0.1".into(),
                "localhost".into(),
                "kubernetes".into(),
                "kubernetes.default".into(),
                "kubernetes.default.svc".into(),
                "10.0.0.1".into(),
                node::NODE_IP.into(),
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
        // With a real node the API server listens on the node's address, where pods reach it
        // through the `kubernetes` Service; otherwise on loopback only.
        let address = if self.options.real_node {
            node::NODE_IP
        } else {
            "127.0.0.1"
        };
        self.server = format!("https://{address}:{api_port}");
        let kubeconfig = kubeconfig::client_kubeconfig(
            &self.server,
            &self.ca.cert.cert_pem,
            "admin",
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
        let extra = if self.options.real_node {
            self.real_node_flags(&admin, &ca_file)?
        } else {
            Vec::new()
        };
        let authorization = if self.options.real_node {
            "--authorization-mode=Node,RBAC"
        } else {
            "--authorization-mode=RBAC"
        };
        let mut args = vec![
                format!("--etcd-servers={etcd_url}"),
                format!("--bind-address={address}"),
                format!("--advertise-address={address}"),
                format!("--secure-port={api_port}"),
                format!("--tls-cert-file={}", d(&serving_cert)),
                format!("--tls-private-key-file={}", d(&serving_key)),
                format!("--client-ca-file={}", d(&ca_file)),
                format!("--service-account-key-file={}", d(&sa_pub_file)),
                format!("--service-account-signing-key-file={}", d(&sa_key_file)),
                "--service-account-issuer=https://kubernetes.default.svc".into(),
                "--api-audiences=https://kubernetes.default.svc".into(),
                authorization.into(),
                "--enable-admission-plugins=NamespaceLifecycle,ServiceAccount,NodeRestriction,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy,ResourceQuota".into(),
                "--service-cluster-ip-range=10.0.0.0/24".into(),
                "--allow-privileged=true".into(),
                "--enable-priority-and-fairness=false".into(),
                format!("--cert-dir={}", d(&self.root.join("apiserver-certs"))),
                "--v=1".into(),
        ];
        args.extend(extra);
        self.launch("kube-apiserver", &args)?;
        self.wait_ready("kube-apiserver", Duration::from_secs(90))
            .await
    }

    /// etcd on two free ports; its client URL.
    fn start_etcd(&mut self) -> Result<String, DevClusterError> {
        let etcd_client = free_port()?;
        let etcd_peer = free_port()?;
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
        Ok(etcd_url)
    }

    /// The API server's flags for a real node: its client certificate for the kubelets, and
    /// the aggregation layer as kubeadm sets it up.
    fn real_node_flags(
        &self,
        admin: &offload_operator::ops::certs::IssuedCert,
        ca_file: &Path,
    ) -> Result<Vec<String>, DevClusterError> {
        let d = |p: &Path| p.display().to_string();
        let mut extra: Vec<String> = Vec::new();
        let kubelet_client = self.write("apiserver-kubelet-client.crt", &admin.cert_pem)?;
        let kubelet_key = self.write("apiserver-kubelet-client.key", &admin.key_pem)?;
        // The aggregation layer, as kubeadm sets it up: the API server proxies to aggregated
        // APIs (Kueue's visibility API) as front-proxy-client, and publishes the CA that
        // vouches for it in kube-system/extension-apiserver-authentication.
        let front_proxy = pki::issue_client(&self.ca, "front-proxy-client", &[], YEAR)?;
        let front_proxy_cert = self.write("front-proxy-client.crt", &front_proxy.cert_pem)?;
        let front_proxy_key = self.write("front-proxy-client.key", &front_proxy.key_pem)?;
        extra.extend([
            format!("--requestheader-client-ca-file={}", d(ca_file)),
            "--requestheader-allowed-names=front-proxy-client".to_string(),
            "--requestheader-username-headers=X-Remote-User".to_string(),
            "--requestheader-group-headers=X-Remote-Group".to_string(),
            "--requestheader-extra-headers-prefix=X-Remote-Extra-".to_string(),
            format!("--proxy-client-cert-file={}", d(&front_proxy_cert)),
            format!("--proxy-client-key-file={}", d(&front_proxy_key)),
        ]);
        extra.extend([
            // The API server reaches webhooks and aggregated APIs at a Service's endpoint
            // addresses: no kube-proxy on its own path.
            "--enable-aggregator-routing=true".to_string(),
            format!("--kubelet-client-certificate={}", d(&kubelet_client)),
            // The node's name resolves nowhere here: reach kubelets by address.
            "--kubelet-preferred-address-types=InternalIP".to_string(),
            format!("--kubelet-client-key={}", d(&kubelet_key)),
        ]);
        Ok(extra)
    }

    /// Launches kube-controller-manager; the port it serves on.
    pub(super) fn start_controller_manager(&mut self) -> Result<u16, DevClusterError> {
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
        )?;
        Ok(port)
    }

    /// Launches kube-scheduler; the port it serves on.
    pub(super) fn start_scheduler(&mut self) -> Result<u16, DevClusterError> {
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
        )?;
        Ok(port)
    }

    /// Launches kwok; the port it serves on.
    pub(super) fn start_kwok(&mut self) -> Result<u16, DevClusterError> {
        let stages = self.bin_dir.join("../kwok-stages");
        let mut configs = Vec::new();
        if let Ok(entries) = fs::read_dir(&stages) {
            let mut files: Vec<PathBuf> = entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.file_name().is_none_or(|n| n != "pod-complete.yaml"))
                .collect();
            files.sort();
            configs.extend(
                files
                    .into_iter()
                    .map(|p| format!("--config={}", p.display())),
            );
        }
        // Pods of Jobs complete as kwok's fast stage has them, except those annotated to keep
        // running (offload.dev/kwok-keep-running).
        let complete = self.root.join("kwok-pod-complete.yaml");
        fs::write(&complete, include_str!("../../kwok/pod-complete.yaml"))
            .map_err(io_err("writing kwok's pod-complete stage"))?;
        configs.push(format!("--config={}", complete.display()));
        // Pods annotated offload.dev/kwok-out-of-memory end as a training process that ran out of
        // GPU or host memory does (a stand-in: no process is behind them).
        let oom = self.root.join("kwok-pod-out-of-memory.yaml");
        fs::write(&oom, include_str!("../../kwok/pod-out-of-memory.yaml"))
            .map_err(io_err("writing kwok's out-of-memory stages"))?;
        configs.push(format!("--config={}", oom.display()));
        // Pods annotated offload.dev/kwok-report complete with that text as their termination
        // message, as the operator's reporter writes it (a stand-in as well).
        let reported = self.root.join("kwok-pod-reported.yaml");
        fs::write(&reported, include_str!("../../kwok/pod-reported.yaml"))
            .map_err(io_err("writing kwok's reported-completion stages"))?;
        configs.push(format!("--config={}", reported.display()));
        // The sizer's pods end as their annotations have them (a stand-in for the sizer).
        let sized = self.root.join("kwok-pod-sized.yaml");
        fs::write(&sized, include_str!("../../kwok/pod-sized.yaml"))
            .map_err(io_err("writing kwok's sizer stages"))?;
        configs.push(format!("--config={}", sized.display()));
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
        self.launch("kwok", &args)?;
        Ok(port)
    }

    /// Waits until each component listens on its port. One that exits first (its port taken
    /// by another process, most often) is an error with the end of its log, so a cluster never
    /// starts without a scheduler or controller manager that tests then wait on in vain.
    pub(super) async fn wait_listening(
        &mut self,
        components: &[(&'static str, u16)],
        timeout: Duration,
    ) -> Result<(), DevClusterError> {
        let mut waiting: Vec<(&'static str, u16)> = components.to_vec();
        self.poll_ready(timeout, async || {
            let mut still = Vec::new();
            for (name, port) in waiting.drain(..) {
                if tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .is_err()
                {
                    still.push((name, port));
                }
            }
            waiting = still;
            waiting.first().map(|&(name, _)| name)
        })
        .await
    }
}

//! The chart's dashboard and alerts against a real Prometheus (Debian's package) scraping the
//! operator's and the agent's pods on the real node: every panel's queries return series, and
//! every alert's rule evaluates without error.

use super::*;

/// The folder with `prometheus`, from `OFFLOAD_PROMETHEUS_BIN` (the test command sets it) or
/// the project's script (cached outside the clone).
fn prometheus_bin() -> std::path::PathBuf {
    if let Ok(dir) = std::env::var("OFFLOAD_PROMETHEUS_BIN") {
        return dir.into();
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new("bash")
        .arg(root.join("hack/monitoring/prometheus.sh"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "hack/monitoring/prometheus.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().into()
}

/// A query string as a URL's query component.
fn encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Prometheus, killed when dropped.
struct Prometheus {
    child: std::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// The series `query` returns now; `None` until Prometheus answers.
    async fn series(&self, query: &str) -> Option<Vec<serde_json::Value>> {
        let path = format!("/api/v1/query?query={}", encoded(query));
        let answer = offload_testenv::http::get(self.port, &path).await?;
        let body: serde_json::Value = serde_json::from_str(&answer.body).ok()?;
        assert_eq!(body["status"], "success", "{query}: {}", answer.body);
        body["data"]["result"].as_array().cloned()
    }
}

/// The pods of `component` in the release namespace, with their IPs.
async fn pod_targets(client: &kube::Client, component: &str) -> Vec<(String, String)> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let list = pods
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/component={component}")))
        .await
        .unwrap();
    list.items
        .iter()
        .filter_map(|p| Some((p.metadata.name.clone()?, p.status.as_ref()?.pod_ip.clone()?)))
        .collect()
}

/// One scrape job: its name, the port its pods serve metrics on, and the pods (name, IP).
struct ScrapeJob {
    name: &'static str,
    port: u16,
    pods: Vec<(String, String)>,
}

fn start(jobs: &[ScrapeJob]) -> Prometheus {
    let dir = tempfile::tempdir().unwrap();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let rules = root.join("charts/offload-operator/files/alerts.yaml");
    let mut scrape = String::new();
    for ScrapeJob {
        name: job,
        port,
        pods,
    } in jobs
    {
        scrape.push_str(&format!("  - job_name: {job}\n    static_configs:\n"));
        for (name, ip) in pods {
            scrape.push_str(&format!(
                "      - targets: ['{ip}:{port}']\n        labels: {{pod: {name}}}\n"
            ));
        }
    }
    let config = format!(
        "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nrule_files: ['{}']\nscrape_configs:\n{scrape}",
        rules.display()
    );
    std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = std::process::Command::new(prometheus_bin().join("prometheus"))
        .arg(format!(
            "--config.file={}",
            dir.path().join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("prometheus.log")).unwrap())
        .spawn()
        .unwrap();
    Prometheus {
        child,
        port,
        _dir: dir,
    }
}

/// Every panel of the dashboard returns series from a Prometheus scraping the operator's two
/// pods and the agent (while a TrainingJob's pod is observed and another job is held), and every
/// alert's rule evaluates.
pub(super) async fn the_dashboard_and_alerts_work_against_a_real_prometheus(
    client: &kube::Client,
    figures: &mut Figures,
) {
    // A job held for a profile that does not exist: the held panels have a series.
    let tjs: Api<TrainingJob> = Api::namespaced(client.clone(), "default");
    let held = training_job("held-for-a-profile", "no-such-profile");
    create_when_admitted(&tjs, &held, "a TrainingJob of a profile not created").await;

    let operator = pod_targets(client, "operator").await;
    let agent = pod_targets(client, "agent").await;
    assert_eq!(operator.len(), 2, "{operator:?}");
    assert_eq!(agent.len(), 1, "{agent:?}");
    let started = Instant::now();
    let prometheus = start(&[
        ScrapeJob {
            name: "offload-operator",
            port: 8080,
            pods: operator,
        },
        ScrapeJob {
            name: "offload-agent",
            port: 8081,
            pods: agent,
        },
    ]);
    poll("Prometheus to scrape every target", WAIT, || async {
        let up = prometheus.series("up == 1").await?;
        (up.len() == 3).then_some(())
    })
    .await;
    figures.add(format!(
        "Prometheus started and scraping the operator's two pods and the agent: {:.1} s",
        started.elapsed().as_secs_f64()
    ));

    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("charts/offload-operator/files/dashboard.json"))
            .unwrap(),
    )
    .unwrap();
    for panel in dashboard["panels"].as_array().unwrap() {
        let title = panel["title"].as_str().unwrap();
        let queries: Vec<String> = panel["targets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["expr"].as_str().unwrap().to_string())
            .collect();
        // Rates need two scrapes inside their window: asked again until one answers.
        let answered = poll(&format!("series for the panel {title:?}"), WAIT, || async {
            for q in &queries {
                let series = prometheus.series(q).await?;
                if !series.is_empty() {
                    return Some(series.len());
                }
            }
            None
        })
        .await;
        eprintln!("panel {title:?}: {answered} series");
    }

    // Every alert's rule evaluates (health ok), whether or not it fires.
    let rules = poll("every alert rule evaluated", WAIT, || async {
        let answer = offload_testenv::http::get(prometheus.port, "/api/v1/rules").await?;
        let body: serde_json::Value = serde_json::from_str(&answer.body).ok()?;
        let rules: Vec<serde_json::Value> = body["data"]["groups"]
            .as_array()?
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        (!rules.is_empty() && rules.iter().all(|r| r["health"] == "ok")).then_some(rules)
    })
    .await;
    assert_eq!(rules.len(), 6, "{rules:#?}");
    // The held job is seen as held (the alert waits 15 minutes before it fires).
    let held_rule = rules
        .iter()
        .find(|r| r["name"] == "OffloadTrainingJobHeld")
        .unwrap();
    let alerts = held_rule["alerts"].as_array().cloned().unwrap_or_default();
    assert!(
        alerts
            .iter()
            .any(|a| a["labels"]["trainingjob"] == "held-for-a-profile"
                && a["labels"]["reason"] == "ProfileNotFound"
                && a["state"] == "pending"),
        "{held_rule:#}"
    );
    tjs.delete("held-for-a-profile", &Default::default())
        .await
        .unwrap();
}

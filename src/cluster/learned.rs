//! Where what the memory model learned lives: one ConfigMap the operator owns in its own
//! namespace ([`CONFIG_MAP`], key [`KEY`]), read at start and watched, so lessons survive
//! restarts and reach every replica (the webhook's decisions use them too); deleting it forgets
//! everything.
//!
//! The leader records lessons in memory and writes them in batches ([`FLUSH_EVERY`]): each
//! write reads the stored document, applies the lessons recorded since the last write on top,
//! and replaces it at that resourceVersion, so an edit or a delete in between is never
//! overwritten with stale figures (a conflict waits for the next batch). A stored document that
//! does not parse is left alone, named in the log and in every write's place, until it is fixed
//! or deleted; nothing learned is used from it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;

use crate::decision::LearnedView;
use crate::decision::runs::learned::LearnedMemory;
use crate::decision::runs::learned::Reservation;
use crate::decision::runs::learned::Run;
use offload_api::v1alpha1::NodeClass;

/// The ConfigMap the lessons are kept in.
pub const CONFIG_MAP: &str = "offload-operator-learned";
/// Its key.
pub const KEY: &str = "memory.json";
/// The key of the trials taken whose runs are not known yet
/// ([`crate::decision::runs::learned::Reservation`], a JSON list): beside the lessons, so that a
/// version of the operator that does not know them reads the lessons as before.
pub const TRIALS_KEY: &str = "trials.json";
/// Most trials taken kept at once (the oldest go first).
const MAX_RESERVATIONS: usize = 1_000;
/// How many times taking a trial reads and writes again after another writer's change.
const TAKE_ATTEMPTS: usize = 5;
/// How often recorded lessons are written.
pub const FLUSH_EVERY: Duration = Duration::from_secs(5);

/// One lesson to be written.
#[derive(Clone, Debug, PartialEq)]
struct Pending {
    profile: String,
    class: NodeClass,
    shape: String,
    described: String,
    run: Run,
}

#[derive(Debug, Default)]
struct State {
    /// What decisions use now: the stored document with the pending lessons applied.
    memory: Arc<LearnedMemory>,
    /// Recorded since the last write.
    pending: Vec<Pending>,
    /// Why the stored document is not used, where it does not parse.
    unreadable: Option<String>,
}

/// The lessons, shared by the controllers and the webhook of one process.
#[derive(Clone, Debug)]
pub struct LearnedStore {
    namespace: String,
    state: Arc<Mutex<State>>,
    /// Whether the stored document (or its absence) has been read once: before that, a
    /// decision would not know what earlier runs taught.
    synced: Arc<tokio::sync::watch::Sender<bool>>,
}

/// Most lessons waiting for a write; more are dropped (a later window records them again).
const MAX_PENDING: usize = 10_000;

impl LearnedStore {
    /// An empty store for the ConfigMap in `namespace`; [`LearnedStore::watch`] fills it.
    pub fn new(namespace: impl Into<String>) -> Self {
        LearnedStore {
            namespace: namespace.into(),
            state: Arc::default(),
            synced: Arc::new(tokio::sync::watch::Sender::new(false)),
        }
    }

    /// Waits until the stored document has been read once ([`LearnedStore::watch`]); `false`
    /// where the store was dropped first.
    pub async fn wait_synced(&self) -> bool {
        let mut synced = self.synced.subscribe();
        synced.wait_for(|s| *s).await.is_ok()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// What decisions use now, aged to now.
    pub fn view(&self) -> LearnedView {
        LearnedView {
            memory: self.lock().memory.clone(),
            now: jiff::Timestamp::now(),
            namespace: None,
            job: None,
        }
    }

    /// Shapes and runs learned under `profile`.
    pub fn summary(&self, profile: &str) -> (usize, usize) {
        self.lock().memory.summary(profile)
    }

    /// Records a run's lesson: used by decisions at once, written with the next batch. A lesson
    /// that cannot be true changes nothing (the error says why).
    pub fn record(
        &self,
        profile: &str,
        class: NodeClass,
        shape: &str,
        described: &str,
        run: Run,
    ) -> Result<bool, crate::decision::runs::learned::LearnedError> {
        let mut state = self.lock();
        let mut memory = (*state.memory).clone();
        let changed = memory.record(profile, class, shape, described, run.clone())?;
        if changed {
            state.memory = Arc::new(memory);
            if state.pending.len() < MAX_PENDING {
                state.pending.push(Pending {
                    profile: profile.into(),
                    class,
                    shape: shape.into(),
                    described: described.into(),
                    run,
                });
            }
        }
        Ok(changed)
    }

    /// Takes the stored document as read (or its absence): what decisions use is it with the
    /// lessons not yet written on top.
    fn stored(&self, cm: Option<&ConfigMap>) {
        let text = cm.and_then(|c| c.data.as_ref()).and_then(|d| d.get(KEY));
        let parsed = match text {
            None => Ok(LearnedMemory::default()),
            Some(t) => LearnedMemory::parse(t),
        }
        .map(|m| LearnedMemory {
            reservations: reservations_of(cm),
            ..m
        });
        let mut state = self.lock();
        match parsed {
            Ok(mut memory) => {
                for p in &state.pending {
                    let _ =
                        memory.record(&p.profile, p.class, &p.shape, &p.described, p.run.clone());
                }
                state.memory = Arc::new(memory);
                state.unreadable = None;
            }
            Err(e) => {
                if state.unreadable.as_deref() != Some(&e.to_string()) {
                    tracing::warn!(configmap = CONFIG_MAP, error = %e, "the stored lessons do not parse: nothing learned is used or written until the ConfigMap is fixed or deleted");
                }
                state.memory = Arc::new(LearnedMemory::default());
                state.unreadable = Some(e.to_string());
            }
        }
    }

    /// Watches the ConfigMap until `stop` (every replica: what decisions use).
    pub async fn watch(&self, client: Client, stop: CancellationToken) {
        let api: Api<ConfigMap> = Api::namespaced(client, &self.namespace);
        let config = watcher::Config::default().fields(&format!("metadata.name={CONFIG_MAP}"));
        let mut events = watcher::watcher(api, config).boxed();
        // Whether the ConfigMap was there when last seen, and whether the list being read (at
        // start, or again after a lost watch) holds it: one that was there and is missing from
        // a fresh list was deleted while nobody watched. (One never written yet is not a
        // delete: lessons waiting for their first write stay.)
        let (mut present, mut listed) = (false, false);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                event = events.next() => match event {
                    Some(Ok(watcher::Event::Apply(cm))) => {
                        present = true;
                        self.stored(Some(&cm));
                    }
                    Some(Ok(watcher::Event::InitApply(cm))) => {
                        (present, listed) = (true, true);
                        self.stored(Some(&cm));
                    }
                    Some(Ok(watcher::Event::Delete(_))) => {
                        present = false;
                        self.forget();
                    }
                    Some(Ok(watcher::Event::Init)) => listed = false,
                    Some(Ok(watcher::Event::InitDone)) => {
                        if present && !listed {
                            present = false;
                            self.forget();
                        }
                        self.synced.send_replace(true);
                    }
                    Some(Err(e)) => tracing::debug!(error = %e, "watching the learned ConfigMap"),
                    None => return,
                },
            }
        }
    }

    /// The ConfigMap is gone: lessons recorded before the delete go too.
    fn forget(&self) {
        self.lock().pending.clear();
        self.stored(None);
    }

    /// Writes recorded lessons every [`FLUSH_EVERY`] until `stop` (the leader), and once more
    /// on the way out.
    pub async fn write_batches(&self, client: Client, stop: CancellationToken) {
        let api: Api<ConfigMap> = Api::namespaced(client, &self.namespace);
        let mut tick = tokio::time::interval(FLUSH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let last = tokio::select! {
                () = stop.cancelled() => true,
                _ = tick.tick() => false,
            };
            if let Err(e) = self.flush(&api).await {
                tracing::warn!(configmap = CONFIG_MAP, error = %e, "writing the learned lessons; tried again in the next batch");
            }
            if last {
                return;
            }
        }
    }

    /// Writes the lessons recorded since the last write on top of the stored document.
    async fn flush(&self, api: &Api<ConfigMap>) -> Result<(), kube::Error> {
        let pending = {
            let state = self.lock();
            if state.pending.is_empty() || state.unreadable.is_some() {
                return Ok(());
            }
            state.pending.clone()
        };
        let current = api.get_opt(CONFIG_MAP).await?;
        let mut memory = match current
            .as_ref()
            .and_then(|c| c.data.as_ref())
            .and_then(|d| d.get(KEY))
        {
            None => LearnedMemory::default(),
            Some(text) => match LearnedMemory::parse(text) {
                Ok(m) => m,
                Err(e) => {
                    self.lock().unreadable = Some(e.to_string());
                    return Ok(());
                }
            },
        };
        for p in &pending {
            let _ = memory.record(&p.profile, p.class, &p.shape, &p.described, p.run.clone());
        }
        let json = memory.to_json().map_err(kube::Error::SerdeError)?;
        let mut cm = current.unwrap_or_else(new_config_map);
        cm.data
            .get_or_insert_with(Default::default)
            .insert(KEY.into(), json);
        let written = if cm.resource_version().is_some() {
            api.replace(CONFIG_MAP, &PostParams::default(), &cm).await?
        } else {
            api.create(&PostParams::default(), &cm).await?
        };
        let mut state = self.lock();
        // Lessons recorded while the write was on its way stay pending.
        state.pending.retain(|p| !pending.contains(p));
        drop(state);
        self.stored(Some(&written));
        Ok(())
    }
}

/// The trials taken kept in `cm` (none where it has none, or they do not read: a list the
/// operator cannot read counts nothing and is written over by the next trial taken).
fn reservations_of(cm: Option<&ConfigMap>) -> Vec<Reservation> {
    cm.and_then(|c| c.data.as_ref())
        .and_then(|d| d.get(TRIALS_KEY))
        .filter(|t| t.len() <= crate::decision::runs::learned::MAX_LEARNED_BYTES)
        .and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or_default()
}

impl LearnedStore {
    /// Takes a trial of `reservation`'s shape for its job where fewer than `bound` are taken
    /// (trials that ran and trials taken, in `namespace` where given, not counting the job's
    /// own): reads the ConfigMap, counts, and writes the reservation at the resourceVersion it
    /// read, again after another writer's change. `Ok(false)`: the bound is reached, and the
    /// job is to be decided again without a trial.
    pub async fn take_trial(
        &self,
        client: Client,
        reservation: Reservation,
        bound: u32,
        namespace: Option<&str>,
    ) -> Result<bool, kube::Error> {
        let api: Api<ConfigMap> = Api::namespaced(client, &self.namespace);
        for _ in 0..TAKE_ATTEMPTS {
            let current = api.get_opt(CONFIG_MAP).await?;
            let stored = match current
                .as_ref()
                .and_then(|c| c.data.as_ref())
                .and_then(|d| d.get(KEY))
            {
                None => LearnedMemory::default(),
                Some(text) => match LearnedMemory::parse(text) {
                    Ok(m) => m,
                    // Nothing learned is used from it: no trial can have been decided from it.
                    Err(_) => return Ok(false),
                },
            };
            let now = jiff::Timestamp::now();
            let mut reservations = reservations_of(current.as_ref());
            reservations.retain(|r| r.job != reservation.job);
            let memory = LearnedMemory {
                reservations: reservations.clone(),
                ..stored
            };
            let (p, c, s) = (
                reservation.profile.as_str(),
                reservation.class,
                reservation.shape.as_str(),
            );
            let ran = memory
                .evidence_of(p, c, s, now, namespace)
                .iter()
                .filter(|r| r.trial)
                .count();
            let taken = memory.reserved_trials(p, c, s, now, namespace, None);
            if ran + taken >= bound as usize {
                // What this replica decides from catches up with what it just read.
                self.stored(current.as_ref());
                return Ok(false);
            }
            reservations.retain(|r| r.counts(now, None));
            reservations.push(reservation.clone());
            let excess = reservations.len().saturating_sub(MAX_RESERVATIONS);
            reservations.drain(..excess);
            let json = serde_json::to_string(&reservations).map_err(kube::Error::SerdeError)?;
            let mut cm = current.unwrap_or_else(new_config_map);
            cm.data
                .get_or_insert_with(Default::default)
                .insert(TRIALS_KEY.into(), json);
            let written = if cm.resource_version().is_some() {
                api.replace(CONFIG_MAP, &PostParams::default(), &cm).await
            } else {
                api.create(&PostParams::default(), &cm).await
            };
            match written {
                Ok(cm) => {
                    self.stored(Some(&cm));
                    return Ok(true);
                }
                // Another writer was first: read again and count again.
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(false)
    }
}

/// The ConfigMap as the operator first writes it.
fn new_config_map() -> ConfigMap {
    ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(CONFIG_MAP.into()),
            labels: Some(
                [(
                    "app.kubernetes.io/managed-by".to_string(),
                    "offload-operator".to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        ..Default::default()
    }
}

impl LearnedStore {
    /// A store holding `memory` and never written (tests and `explain`).
    pub fn fixed(memory: LearnedMemory) -> Self {
        let store = LearnedStore::new("");
        store.lock().memory = Arc::new(memory);
        store.synced.send_replace(true);
        store
    }
}

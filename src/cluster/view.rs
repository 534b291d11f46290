//! The cluster as the decision's callers see it: the profiles, the node index and the installed
//! APIs of other job kinds — over the operator's shared caches ([`StoreView`]), or held in
//! memory ([`MemoryView`]: `offload-operator explain`, tests and benchmarks). The controller,
//! the webhook and `explain` all decide against one of these.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{LimitRange, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::cluster::caches::Caches;
use crate::cluster::node_views::NodeViews;
use crate::cluster::tolerant::Tolerant;
use crate::decision::ClusterView;
use crate::dra::DraOptions;
use crate::dra::api::ResourceClaimTemplate;
use crate::index::{NodeIndex, NodeInfo};
use crate::render::RenderOptions;
use offload_api::v1alpha1::{OffloadProfile, OffloadProfileSpec};

/// What the webhook needs beside the decision's view: the installed APIs of other job kinds
/// and what the operator writes beside the decision.
pub trait AdmissionView: ClusterView {
    /// What the installed APIs of other job kinds take.
    fn features(&self) -> ApiFeatures;
    /// What the operator writes beside the decision (the start-up guard's image).
    fn render_options(&self) -> RenderOptions;
    /// The sizer's traces, where the webhook may run the sizer for the pods it holds (the
    /// operator traces models in the cluster).
    fn trace_store(&self) -> Option<&crate::cluster::traces::TraceStore> {
        None
    }
}

/// Where the installed Kubeflow Trainer takes a TrainJob's per-job pod settings. The API server
/// prunes fields a CRD's schema does not know, without an error, so the webhook must write the
/// field the installed version has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TrainJobApi {
    /// Trainer 2.2 and later: `spec.runtimePatches`, entries keyed by manager.
    #[default]
    RuntimePatches,
    /// Trainer 2.1: `spec.podTemplateOverrides`.
    PodTemplateOverrides,
    /// A TrainJob CRD with neither field (Trainer 2.0 has only `podSpecOverrides`, which cannot
    /// take node affinity): placement cannot be written, so opted-in TrainJobs are refused.
    Unsupported,
}

impl TrainJobApi {
    /// The API of an installed TrainJob CRD, from the schema of its storage version.
    pub fn from_crd(crd: &CustomResourceDefinition) -> Self {
        Self::from_schema(crd).unwrap_or(TrainJobApi::Unsupported)
    }

    fn from_schema(crd: &CustomResourceDefinition) -> Option<Self> {
        let version = crd
            .spec
            .versions
            .iter()
            .find(|v| v.storage)
            .or_else(|| crd.spec.versions.first())?;
        let spec = version
            .schema
            .as_ref()?
            .open_api_v3_schema
            .as_ref()?
            .properties
            .as_ref()?
            .get("spec")?
            .properties
            .as_ref()?;
        if spec.contains_key("runtimePatches") {
            Some(TrainJobApi::RuntimePatches)
        } else if spec.contains_key("podTemplateOverrides") {
            Some(TrainJobApi::PodTemplateOverrides)
        } else {
            Some(TrainJobApi::Unsupported)
        }
    }
}

/// Facts about the cluster's installed APIs that change what the webhook writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApiFeatures {
    /// The installed Kubeflow Trainer's TrainJob API.
    pub trainjob: TrainJobApi,
}

/// The view over the process's shared caches.
#[derive(Clone)]
pub struct StoreView {
    /// Profiles.
    pub profiles: Store<OffloadProfile>,
    /// The node index, shared by every caller.
    pub nodes: Arc<NodeViews>,
    /// The TrainJob CRD, when Kubeflow Trainer is installed.
    pub trainjob_crd: Option<Store<CustomResourceDefinition>>,
    /// What the operator writes beside the decision.
    pub render: RenderOptions,
    /// ResourceClaimTemplates (DRA), when DRA is on.
    pub claim_templates: Option<Store<Tolerant<ResourceClaimTemplate>>>,
    /// DRA's driver and GPU DeviceClasses (`None`: off).
    pub dra: Option<DraOptions>,
    /// What runs taught the memory model (`None`: nothing is learned).
    pub learned: Option<crate::cluster::learned::LearnedStore>,
    /// LimitRanges of every namespace, where the view watches them.
    pub limit_ranges: Option<Store<LimitRange>>,
    /// The sizer's traces, where the operator traces models (`None`: it does not).
    pub traces: Option<crate::cluster::traces::TraceStore>,
    /// Whether the API server runs the `ExtendedResourceToleration` admission plugin.
    pub extended_resource_toleration: bool,
}

impl StoreView {
    /// The same view, writing the start-up guard with `image` (the agent image).
    pub fn with_guard_image(mut self, image: Option<String>) -> Self {
        self.render.guard_image = image;
        self
    }

    /// A view over the caches.
    pub fn new(caches: &Caches) -> Self {
        StoreView {
            profiles: caches.profiles.store().clone(),
            nodes: caches.node_views.clone(),
            trainjob_crd: Some(caches.trainjob_crd.store().clone()),
            render: RenderOptions::default(),
            claim_templates: Some(caches.claim_templates.store().clone()),
            dra: caches.dra.clone(),
            learned: caches.learned.clone(),
            limit_ranges: Some(caches.limit_ranges.store().clone()),
            traces: caches.traces.clone(),
            extended_resource_toleration: caches.extended_resource_toleration,
        }
    }

    /// A view over two stores (tests, tools that fill stores themselves).
    pub fn from_stores(profiles: Store<OffloadProfile>, nodes: Store<Node>) -> Self {
        StoreView {
            profiles,
            nodes: Arc::new(NodeViews::new(nodes)),
            trainjob_crd: None,
            render: RenderOptions::default(),
            claim_templates: None,
            dra: None,
            learned: None,
            limit_ranges: None,
            traces: None,
            extended_resource_toleration: false,
        }
    }
}

impl ClusterView for StoreView {
    fn profile(&self, name: &str) -> Option<OffloadProfileSpec> {
        self.profiles
            .get(&ObjectRef::new(name))
            .map(|p| p.spec.clone())
    }

    fn nodes(&self) -> Arc<NodeIndex> {
        self.nodes.get()
    }

    fn dra(&self) -> Option<DraOptions> {
        self.dra.clone()
    }

    fn claim_template(&self, namespace: &str, name: &str) -> Option<Arc<ResourceClaimTemplate>> {
        let guard = self
            .claim_templates
            .as_ref()?
            .get(&ObjectRef::new(name).within(namespace))?;
        guard.0.as_ref().ok().map(|t| Arc::new(t.clone()))
    }

    fn learned(&self) -> Option<crate::decision::LearnedView> {
        self.learned
            .as_ref()
            .map(crate::cluster::learned::LearnedStore::view)
    }

    fn model_trace(
        &self,
        namespace: &str,
        step: &crate::decision::SizerRequest,
    ) -> crate::decision::TraceInput {
        self.traces
            .as_ref()
            .map_or(crate::decision::TraceInput::None, |t| {
                t.lookup(namespace, step, jiff::Timestamp::now())
            })
    }

    fn traces_models(&self) -> bool {
        self.traces.is_some()
    }

    fn extended_resource_toleration(&self) -> bool {
        self.extended_resource_toleration
    }

    fn namespace_limits(&self, namespace: &str) -> crate::decision::pod::limits::NamespaceLimits {
        let Some(store) = self.limit_ranges.as_ref() else {
            return Default::default();
        };
        let ranges = store.state();
        crate::decision::pod::limits::NamespaceLimits::of(
            ranges
                .iter()
                .filter(|r| r.metadata.namespace.as_deref() == Some(namespace))
                .map(AsRef::as_ref),
        )
    }
}

impl AdmissionView for StoreView {
    fn features(&self) -> ApiFeatures {
        let trainjob = self
            .trainjob_crd
            .as_ref()
            .and_then(|s| s.state().first().cloned())
            .map(|crd| TrainJobApi::from_crd(&crd))
            .unwrap_or_default();
        ApiFeatures { trainjob }
    }

    fn render_options(&self) -> RenderOptions {
        self.render.clone()
    }

    fn trace_store(&self) -> Option<&crate::cluster::traces::TraceStore> {
        self.traces.as_ref()
    }
}

/// A view held in memory: profiles by name and a node index.
#[derive(Clone, Debug, Default)]
pub struct MemoryView {
    /// Profiles by name.
    pub profiles: BTreeMap<String, OffloadProfileSpec>,
    /// The GPU nodes.
    pub nodes: Arc<NodeIndex>,
    /// The installed APIs of other job kinds.
    pub features: ApiFeatures,
    /// What the operator writes beside the decision.
    pub render: RenderOptions,
    /// DRA's driver and GPU DeviceClasses (`None`: off).
    pub dra: Option<DraOptions>,
    /// ResourceClaimTemplates by namespace and name.
    pub claim_templates: BTreeMap<(String, String), Arc<ResourceClaimTemplate>>,
    /// What runs taught the memory model, where given.
    pub learned: Option<crate::decision::LearnedView>,
    /// Traces of models' steps: given as files, or made by running the sizer here
    /// (`explain --trace-file`, `--trace`).
    pub traces: crate::sizer::local::TraceBook,
    /// Whether the API server runs the `ExtendedResourceToleration` admission plugin.
    pub extended_resource_toleration: bool,
}

impl MemoryView {
    /// These nodes and profiles.
    pub fn new(nodes: Vec<NodeInfo>, profiles: BTreeMap<String, OffloadProfileSpec>) -> Self {
        MemoryView {
            profiles,
            nodes: Arc::new(NodeIndex::new(nodes)),
            ..MemoryView::default()
        }
    }
}

impl ClusterView for MemoryView {
    fn profile(&self, name: &str) -> Option<OffloadProfileSpec> {
        self.profiles.get(name).cloned()
    }

    fn nodes(&self) -> Arc<NodeIndex> {
        self.nodes.clone()
    }

    fn dra(&self) -> Option<DraOptions> {
        self.dra.clone()
    }

    fn claim_template(&self, namespace: &str, name: &str) -> Option<Arc<ResourceClaimTemplate>> {
        self.claim_templates
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    fn learned(&self) -> Option<crate::decision::LearnedView> {
        self.learned.clone()
    }

    fn extended_resource_toleration(&self) -> bool {
        self.extended_resource_toleration
    }

    fn model_trace(
        &self,
        _namespace: &str,
        step: &crate::decision::SizerRequest,
    ) -> crate::decision::TraceInput {
        self.traces.trace(step)
    }
}

impl AdmissionView for MemoryView {
    fn features(&self) -> ApiFeatures {
        self.features
    }

    fn render_options(&self) -> RenderOptions {
        self.render.clone()
    }
}

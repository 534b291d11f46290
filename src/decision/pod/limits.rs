//! What a namespace's LimitRanges do to a pod's memory and CPU before the pod exists. The API server's
//! `LimitRanger` admission plugin gives every container that sets no memory limit the range's
//! default limit, and refuses a container whose memory request or limit is above the range's
//! `max` (or a pod whose containers' sum is above a `Pod` range's `max`). A decision that
//! writes a memory request above either would make pods that are never created: the job is
//! decided as if the pod had that limit, so it is held with the figures instead.

use k8s_openapi::api::core::v1::LimitRange;
use offload_api::quantity;

/// The memory and CPU bounds a namespace's LimitRanges put on a pod's containers, each with
/// the LimitRange it comes from; where several set one, the smallest.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NamespaceLimits {
    /// The CPU limit (cores) a container that sets none gets (else its max): a CFS quota.
    pub cpu_default_limit: Option<(f64, String)>,
    /// The CPU request (cores) a container that sets neither a request nor a limit gets: the
    /// range's `defaultRequest`, else its default limit (the API server fills one from the
    /// other), which the scheduler then needs free on a node.
    pub cpu_default_request: Option<(f64, String)>,
    /// The memory limit a container that sets none gets.
    pub default_limit: Option<Bound>,
    /// The most memory a container may request or be limited to.
    pub container_max: Option<Bound>,
    /// The most memory a pod's containers may be limited to together.
    pub pod_max: Option<Bound>,
    /// The least memory a container may request (`min`): the largest of every range's.
    pub container_min: Option<Bound>,
    /// The most a container's memory limit may be over its request (`maxLimitRequestRatio`),
    /// and the LimitRange that sets it: the smallest of every range's.
    pub memory_ratio: Option<(f64, String)>,
}

/// One bound and where it comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bound {
    /// Bytes.
    pub bytes: u64,
    /// The LimitRange that sets it.
    pub range: String,
}

impl NamespaceLimits {
    /// The bounds of `ranges` (one namespace's). A quantity that does not read is skipped: the
    /// API server validated it, and a bound the operator cannot read is not guessed at.
    pub fn of<'a>(ranges: impl IntoIterator<Item = &'a LimitRange>) -> NamespaceLimits {
        let mut out = NamespaceLimits::default();
        for r in ranges {
            let name = r.metadata.name.clone().unwrap_or_default();
            for item in r.spec.as_ref().map(|s| s.limits.as_slice()).unwrap_or(&[]) {
                let memory = |m: &Option<std::collections::BTreeMap<String, _>>| {
                    m.as_ref()
                        .and_then(|m| m.get("memory"))
                        .and_then(|q| quantity::bytes(q).ok())
                };
                let keep = |slot: &mut Option<Bound>, bytes: Option<u64>| {
                    if let Some(bytes) = bytes
                        && slot.as_ref().is_none_or(|b| bytes < b.bytes)
                    {
                        *slot = Some(Bound {
                            bytes,
                            range: name.clone(),
                        });
                    }
                };
                let cpu = |m: &Option<std::collections::BTreeMap<String, _>>| {
                    m.as_ref()
                        .and_then(|m| m.get("cpu"))
                        .and_then(|q| quantity::cpu_cores(q).ok())
                };
                match item.type_.as_str() {
                    "Container" => {
                        keep(&mut out.default_limit, memory(&item.default));
                        keep(&mut out.container_max, memory(&item.max));
                        if let Some(bytes) = memory(&item.min)
                            && out.container_min.as_ref().is_none_or(|b| bytes > b.bytes)
                        {
                            out.container_min = Some(Bound {
                                bytes,
                                range: name.clone(),
                            });
                        }
                        let ratio = item
                            .max_limit_request_ratio
                            .as_ref()
                            .and_then(|m| m.get("memory"))
                            .and_then(|q| quantity::cpu_cores(q).ok())
                            .filter(|r| *r >= 1.0);
                        if let Some(r) = ratio
                            && out.memory_ratio.as_ref().is_none_or(|(b, _)| r < *b)
                        {
                            out.memory_ratio = Some((r, name.clone()));
                        }
                        if let Some(c) = cpu(&item.default).or_else(|| cpu(&item.max))
                            && out.cpu_default_limit.as_ref().is_none_or(|(b, _)| c < *b)
                        {
                            out.cpu_default_limit = Some((c, name.clone()));
                        }
                        if let Some(c) = cpu(&item.default_request)
                            .or_else(|| cpu(&item.default))
                            .or_else(|| cpu(&item.max))
                            && out.cpu_default_request.as_ref().is_none_or(|(b, _)| c < *b)
                        {
                            out.cpu_default_request = Some((c, name.clone()));
                        }
                    }
                    "Pod" => keep(&mut out.pod_max, memory(&item.max)),
                    _ => {}
                }
            }
        }
        out
    }

    /// Whether no range bounds memory.
    pub fn is_empty(&self) -> bool {
        self.default_limit.is_none()
            && self.container_max.is_none()
            && self.pod_max.is_none()
            && self.cpu_default_limit.is_none()
            && self.cpu_default_request.is_none()
            && self.container_min.is_none()
            && self.memory_ratio.is_none()
    }

    /// The least memory request the LimitRanger takes for a container limited to `limit`
    /// (its `min`, and its limit over `maxLimitRequestRatio`), and why, in words; `None` where
    /// no range bounds it from below.
    pub fn request_floor(&self, limit: Option<u64>) -> Option<(u64, String)> {
        let min = self.container_min.as_ref().map(|m| {
            (
                m.bytes,
                format!("the container memory min of LimitRange {:?}", m.range),
            )
        });
        #[allow(
            clippy::cast_precision_loss,
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss
        )]
        let ratio = match (limit, &self.memory_ratio) {
            (Some(l), Some((r, range))) => Some((
                (l as f64 / r).ceil() as u64,
                format!(
                    "its memory limit over the maxLimitRequestRatio {r} of LimitRange {range:?}"
                ),
            )),
            _ => None,
        };
        match (min, ratio) {
            (Some(a), Some(b)) => Some(if a.0 >= b.0 { a } else { b }),
            (a, b) => a.or(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::PodResources;

    fn range(name: &str, items: serde_json::Value) -> LimitRange {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"limits": items}
        }))
        .unwrap()
    }

    fn pod(containers: serde_json::Value) -> k8s_openapi::api::core::v1::PodSpec {
        serde_json::from_value(serde_json::json!({ "containers": containers })).unwrap()
    }

    const GIB: u64 = 1 << 30;

    #[test]
    fn the_smallest_default_and_max_of_every_range_count() {
        let limits = NamespaceLimits::of(&[
            range(
                "wide",
                serde_json::json!([{"type": "Container", "default": {"memory": "64Gi"},
                                     "max": {"memory": "512Gi"}}]),
            ),
            range(
                "narrow",
                serde_json::json!([{"type": "Container", "default": {"memory": "16Gi"}},
                                   {"type": "Pod", "max": {"memory": "100Gi"}},
                                   {"type": "PersistentVolumeClaim", "max": {"storage": "1Gi"}}]),
            ),
        ]);
        assert_eq!(
            limits.default_limit,
            Some(Bound {
                bytes: 16 * GIB,
                range: "narrow".into()
            })
        );
        assert_eq!(limits.container_max.as_ref().unwrap().bytes, 512 * GIB);
        assert_eq!(limits.pod_max.as_ref().unwrap().bytes, 100 * GIB);
        assert!(NamespaceLimits::of(&[]).is_empty());
    }

    #[test]
    fn a_container_without_a_limit_gets_the_default_and_none_is_above_the_max() {
        let limits = NamespaceLimits::of(&[range(
            "mem",
            serde_json::json!([{"type": "Container", "default": {"memory": "16Gi"},
                                 "max": {"memory": "32Gi"}}]),
        )]);
        // No limit: the default, said so.
        let spec = pod(serde_json::json!([{"name": "train", "image": "i",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]));
        let r = PodResources::within(Some(&spec), &limits).unwrap();
        assert_eq!(r.memory_limit, Some(16 * GIB));
        let from = r.memory_limit_source.unwrap();
        assert!(
            from.contains("default memory limit of LimitRange \"mem\""),
            "{from}"
        );
        // Its own limit above the max: the max.
        let spec = pod(serde_json::json!([{"name": "train", "image": "i",
            "resources": {"limits": {"nvidia.com/gpu": "1", "memory": "64Gi"}}}]));
        let r = PodResources::within(Some(&spec), &limits).unwrap();
        assert_eq!(r.memory_limit, Some(32 * GIB));
        assert!(
            r.memory_limit_source
                .unwrap()
                .contains("container memory max")
        );
        // Its own limit within: its own, no source.
        let spec = pod(serde_json::json!([{"name": "train", "image": "i",
            "resources": {"limits": {"nvidia.com/gpu": "1", "memory": "20Gi"}}}]));
        let r = PodResources::within(Some(&spec), &limits).unwrap();
        assert_eq!(
            (r.memory_limit, r.memory_limit_source),
            (Some(20 * GIB), None)
        );
        // No range: no limit, as before.
        let spec = pod(serde_json::json!([{"name": "train", "image": "i"}]));
        assert_eq!(PodResources::of(Some(&spec)).unwrap().memory_limit, None);
        // Only a max: it is the default too, as the LimitRanger defaults it.
        let only_max = NamespaceLimits::of(&[range(
            "max",
            serde_json::json!([{"type": "Container", "max": {"memory": "8Gi"}}]),
        )]);
        let r = PodResources::within(Some(&spec), &only_max).unwrap();
        assert_eq!(r.memory_limit, Some(8 * GIB));
    }

    #[test]
    fn a_requests_floor_is_the_largest_min_and_the_limit_over_the_smallest_ratio() {
        let limits = NamespaceLimits::of(&[
            range(
                "a",
                serde_json::json!([{"type": "Container", "min": {"memory": "8Gi"},
                                     "maxLimitRequestRatio": {"memory": "4"}}]),
            ),
            range(
                "b",
                serde_json::json!([{"type": "Container", "min": {"memory": "24Gi"},
                                     "maxLimitRequestRatio": {"memory": "2"}}]),
            ),
        ]);
        assert_eq!(limits.container_min.as_ref().unwrap().bytes, 24 * GIB);
        assert_eq!(limits.memory_ratio, Some((2.0, "b".into())));
        // The min binds below a limit of 40 GiB (20 GiB by the ratio); the ratio above it.
        let (bytes, why) = limits.request_floor(Some(40 * GIB)).unwrap();
        assert_eq!(bytes, 24 * GIB);
        assert!(why.contains("memory min of LimitRange \"b\""), "{why}");
        let (bytes, why) = limits.request_floor(Some(100 * GIB)).unwrap();
        assert_eq!(bytes, 50 * GIB);
        assert!(why.contains("maxLimitRequestRatio 2"), "{why}");
        // No limit: the min alone; no range: no floor.
        assert_eq!(limits.request_floor(None).unwrap().0, 24 * GIB);
        assert_eq!(NamespaceLimits::default().request_floor(Some(GIB)), None);
        // The training container's floor, from its default limit.
        let ratio_one = NamespaceLimits::of(&[range(
            "one",
            serde_json::json!([{"type": "Container", "default": {"memory": "100Gi"},
                                 "maxLimitRequestRatio": {"memory": "1"}}]),
        )]);
        let spec = pod(serde_json::json!([{"name": "train", "image": "i",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]));
        let r = PodResources::within(Some(&spec), &ratio_one).unwrap();
        assert_eq!(r.training_memory_floor.unwrap().0, 100 * GIB);
    }
}

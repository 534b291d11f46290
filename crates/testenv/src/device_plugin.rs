//! A stand-in GPU device plugin for the real node, which has no GPU: it registers
//! `nvidia.com/gpu` with the kubelet through the device-plugin API (`v1beta1`), advertises
//! devices under the IDs NVIDIA's plugin uses (GPU UUIDs, here those of a recorded utilization
//! trace) and records what the kubelet allocates, so a test can check the kubelet's
//! pod-resources API against it. Nothing is mounted into the containers: no device exists.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::Stream;
use tokio_util::sync::CancellationToken;
use tonic::Status;

/// The kubelet's registration socket (fixed by the device-plugin API, whatever its root dir).
pub const KUBELET_SOCKET: &str = "/var/lib/kubelet/device-plugins/kubelet.sock";
/// The device-plugin API version this stand-in speaks.
pub const API_VERSION: &str = "v1beta1";

/// The messages of `k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1` this stand-in uses, with
/// their upstream field numbers.
pub mod v1beta1 {
    use std::collections::HashMap;

    /// `Empty`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Empty {}

    /// `DevicePluginOptions`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DevicePluginOptions {
        /// Whether `PreStartContainer` must be called.
        #[prost(bool, tag = "1")]
        pub pre_start_required: bool,
        /// Whether `GetPreferredAllocation` is served.
        #[prost(bool, tag = "2")]
        pub get_preferred_allocation_available: bool,
    }

    /// `RegisterRequest`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RegisterRequest {
        /// API version.
        #[prost(string, tag = "1")]
        pub version: String,
        /// The plugin's socket name, relative to the device-plugin directory.
        #[prost(string, tag = "2")]
        pub endpoint: String,
        /// Extended resource name.
        #[prost(string, tag = "3")]
        pub resource_name: String,
        /// Options.
        #[prost(message, optional, tag = "4")]
        pub options: Option<DevicePluginOptions>,
    }

    /// `Device`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Device {
        /// Device ID.
        #[prost(string, tag = "1")]
        pub id: String,
        /// `Healthy` or `Unhealthy`.
        #[prost(string, tag = "2")]
        pub health: String,
    }

    /// `ListAndWatchResponse`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListAndWatchResponse {
        /// Every device of the resource.
        #[prost(message, repeated, tag = "1")]
        pub devices: Vec<Device>,
    }

    /// `ContainerAllocateRequest`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerAllocateRequest {
        /// Devices for one container.
        #[prost(string, repeated, tag = "1")]
        pub devices_ids: Vec<String>,
    }

    /// `AllocateRequest`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AllocateRequest {
        /// One per container.
        #[prost(message, repeated, tag = "1")]
        pub container_requests: Vec<ContainerAllocateRequest>,
    }

    /// `ContainerAllocateResponse` (environment only).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerAllocateResponse {
        /// Environment variables for the container.
        #[prost(map = "string, string", tag = "1")]
        pub envs: HashMap<String, String>,
    }

    /// `AllocateResponse`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AllocateResponse {
        /// One per container, in request order.
        #[prost(message, repeated, tag = "1")]
        pub container_responses: Vec<ContainerAllocateResponse>,
    }
}

use v1beta1::{
    AllocateRequest, AllocateResponse, ContainerAllocateResponse, Device, DevicePluginOptions,
    Empty, ListAndWatchResponse, RegisterRequest,
};

/// A running stand-in plugin; stopping it (or dropping it) closes its socket, and the kubelet
/// then counts its devices as gone.
pub struct StandInDevicePlugin {
    socket: PathBuf,
    allocations: Arc<Mutex<Vec<Vec<String>>>>,
    stop: CancellationToken,
}

#[derive(Clone)]
struct Plugin {
    devices: Arc<Vec<String>>,
    allocations: Arc<Mutex<Vec<Vec<String>>>>,
    stop: CancellationToken,
}

type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;
type DeviceStream = Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

impl tower::Service<http::Request<tonic::body::Body>> for Plugin {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let plugin = self.clone();
        match req.uri().path() {
            "/v1beta1.DevicePlugin/GetDevicePluginOptions" => Box::pin(async move {
                let svc = tower::service_fn(|_: tonic::Request<Empty>| async {
                    Ok::<_, Status>(tonic::Response::new(DevicePluginOptions::default()))
                });
                Ok(tonic::server::Grpc::new(tonic_prost::ProstCodec::default())
                    .unary(svc, req)
                    .await)
            }),
            "/v1beta1.DevicePlugin/ListAndWatch" => Box::pin(async move {
                let svc = tower::service_fn(move |_: tonic::Request<Empty>| {
                    let plugin = plugin.clone();
                    async move {
                        let list = ListAndWatchResponse {
                            devices: plugin
                                .devices
                                .iter()
                                .map(|id| Device {
                                    id: id.clone(),
                                    health: "Healthy".into(),
                                })
                                .collect(),
                        };
                        // The list once, then open until the plugin stops (the kubelet takes
                        // a closed stream for a plugin gone).
                        let stop = plugin.stop.clone();
                        let stream: DeviceStream =
                            Box::pin(futures::stream::unfold(Some(list), move |next| {
                                let stop = stop.clone();
                                async move {
                                    match next {
                                        Some(list) => Some((Ok(list), None)),
                                        None => {
                                            stop.cancelled().await;
                                            None
                                        }
                                    }
                                }
                            }));
                        Ok::<_, Status>(tonic::Response::new(stream))
                    }
                });
                Ok(tonic::server::Grpc::new(tonic_prost::ProstCodec::default())
                    .server_streaming(svc, req)
                    .await)
            }),
            "/v1beta1.DevicePlugin/Allocate" => Box::pin(async move {
                let svc = tower::service_fn(move |r: tonic::Request<AllocateRequest>| {
                    let plugin = plugin.clone();
                    async move {
                        let mut responses = Vec::new();
                        for c in r.into_inner().container_requests {
                            if let Some(bad) =
                                c.devices_ids.iter().find(|id| !plugin.devices.contains(id))
                            {
                                return Err(Status::invalid_argument(format!(
                                    "unknown device {bad}"
                                )));
                            }
                            if let Ok(mut all) = plugin.allocations.lock() {
                                all.push(c.devices_ids.clone());
                            }
                            responses.push(ContainerAllocateResponse {
                                envs: [(
                                    "NVIDIA_VISIBLE_DEVICES".to_string(),
                                    c.devices_ids.join(","),
                                )]
                                .into(),
                            });
                        }
                        Ok(tonic::Response::new(AllocateResponse {
                            container_responses: responses,
                        }))
                    }
                });
                Ok(tonic::server::Grpc::new(tonic_prost::ProstCodec::default())
                    .unary(svc, req)
                    .await)
            }),
            other => {
                let status = Status::unimplemented(format!("{other} is not served"));
                Box::pin(async move { Ok(status.into_http()) })
            }
        }
    }
}

/// Why the stand-in could not start.
#[derive(Debug, thiserror::Error)]
#[error("stand-in device plugin: {0}")]
pub struct DevicePluginError(String);

impl StandInDevicePlugin {
    /// Serves `devices` as `resource` on a socket of its own in the kubelet's device-plugin
    /// directory and registers with the kubelet.
    pub async fn start(
        resource: &str,
        devices: Vec<String>,
    ) -> Result<StandInDevicePlugin, DevicePluginError> {
        let dir = Path::new(KUBELET_SOCKET)
            .parent()
            .unwrap_or(Path::new("/"))
            .to_path_buf();
        let endpoint = format!("offload-stand-in-{}.sock", std::process::id());
        let socket = dir.join(&endpoint);
        let _ = std::fs::remove_file(&socket);
        let listener = tokio::net::UnixListener::bind(&socket)
            .map_err(|e| DevicePluginError(format!("binding {}: {e}", socket.display())))?;
        let stop = CancellationToken::new();
        let allocations = Arc::new(Mutex::new(Vec::new()));
        let plugin = Plugin {
            devices: Arc::new(devices),
            allocations: allocations.clone(),
            stop: stop.clone(),
        };
        let serving = stop.clone();
        tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
            if let Err(e) = tonic::transport::Server::builder()
                .serve_with_incoming_shutdown(plugin, incoming, serving.cancelled_owned())
                .await
            {
                eprintln!("stand-in device plugin stopped: {e}");
            }
        });
        let running = StandInDevicePlugin {
            socket,
            allocations,
            stop,
        };
        register(&endpoint, resource).await?;
        Ok(running)
    }

    /// The device IDs of every container allocation so far, in order.
    pub fn allocations(&self) -> Vec<Vec<String>> {
        self.allocations
            .lock()
            .map(|a| a.clone())
            .unwrap_or_default()
    }
}

impl Drop for StandInDevicePlugin {
    fn drop(&mut self) {
        self.stop.cancel();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// `Registration.Register` on the kubelet's socket.
async fn register(endpoint: &str, resource: &str) -> Result<(), DevicePluginError> {
    let err = |what: &str, e: String| DevicePluginError(format!("{what} {KUBELET_SOCKET}: {e}"));
    let channel = tonic::transport::Endpoint::from_static("http://kubelet.invalid")
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(10))
        .connect_with_connector(tower::service_fn(|_| async {
            let stream = tokio::net::UnixStream::connect(KUBELET_SOCKET).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
        }))
        .await
        .map_err(|e| err("connecting to", e.to_string()))?;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| err("waiting for", e.to_string()))?;
    grpc.unary(
        tonic::Request::new(RegisterRequest {
            version: API_VERSION.into(),
            endpoint: endpoint.into(),
            resource_name: resource.into(),
            options: Some(DevicePluginOptions::default()),
        }),
        http::uri::PathAndQuery::from_static("/v1beta1.Registration/Register"),
        tonic_prost::ProstCodec::<RegisterRequest, Empty>::default(),
    )
    .await
    .map_err(|s| err("registering with", s.message().to_string()))?;
    Ok(())
}

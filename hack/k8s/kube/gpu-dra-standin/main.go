// Command gpu-dra-standin is a stand-in for the kubelet plugin of NVIDIA's DRA driver
// (k8s-dra-driver-gpu) on the local real node, which has no GPU. It is built on the same helper
// the driver uses (k8s.io/dynamic-resource-allocation/kubeletplugin): it registers with the real
// kubelet, publishes the node's ResourceSlice with NVIDIA-shaped devices (driver gpu.nvidia.com,
// one pool named after the node, devices gpu-<minor> with the attributes type, uuid,
// productName, architecture, driverVersion, addressingMode and a memory capacity), and prepares
// and unprepares claims as the driver does: one CDI spec file per prepared claim, whose edits
// set NVIDIA_VISIBLE_DEVICES to the allocated GPUs' UUIDs. No device exists behind any of it.
//
// Every call is logged as one line on standard output ("prepare ...", "unprepare ...",
// "registered", "published ..."), so a test can wait on what the kubelet asked.
//
// With --hang-on-prepare, a prepare call logs "prepare ... hanging" and never returns: a test
// kills the process there to see what a plugin dying mid-prepare leaves behind.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"
)

// The driver's name and the CDI kind its claims' devices are named under, NVIDIA's.
const (
	driverName = "gpu.nvidia.com"
	cdiKind    = "k8s.gpu.nvidia.com/claim"
	maxDevices = 128 // devices per ResourceSlice, the API's limit
)

type options struct {
	kubeconfig     string
	nodeName       string
	kubeletRoot    string
	cdiDir         string
	gpus           int
	product        string
	memory         string
	addressingMode string
	hangOnPrepare  bool
}

// say prints one line of the log (what a test waits on).
var logMu sync.Mutex

func say(format string, args ...any) {
	logMu.Lock()
	defer logMu.Unlock()
	fmt.Printf("%s "+format+"\n", append([]any{time.Now().UTC().Format(time.RFC3339Nano)}, args...)...)
}

// standIn is the plugin: what it prepared, by claim UID.
type standIn struct {
	opts options
	mu   sync.Mutex
}

func (s *standIn) uuid(device string) string {
	return fmt.Sprintf("GPU-%s-%s", s.opts.nodeName, strings.TrimPrefix(device, "gpu-"))
}

func (s *standIn) specPath(uid types.UID) string {
	return filepath.Join(s.opts.cdiDir, fmt.Sprintf("gpu-dra-standin-%s.json", uid))
}

// cdiSpec is the CDI spec file of one claim: one device per claim (named by its UID, never
// reused) whose edits say which GPUs the container was given.
type cdiSpec struct {
	Version string      `json:"cdiVersion"`
	Kind    string      `json:"kind"`
	Devices []cdiDevice `json:"devices"`
}

type cdiDevice struct {
	Name           string   `json:"name"`
	ContainerEdits cdiEdits `json:"containerEdits"`
}

type cdiEdits struct {
	Env []string `json:"env"`
}

func (s *standIn) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	result := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		result[claim.UID] = s.prepare(ctx, claim)
	}
	return result, nil
}

func (s *standIn) prepare(ctx context.Context, claim *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	who := fmt.Sprintf("claim=%s/%s uid=%s", claim.Namespace, claim.Name, claim.UID)
	if claim.Status.Allocation == nil {
		say("prepare %s error=not allocated", who)
		return kubeletplugin.PrepareResult{Err: errors.New("the claim is not allocated")}
	}
	if s.opts.hangOnPrepare {
		say("prepare %s hanging", who)
		<-ctx.Done()
		return kubeletplugin.PrepareResult{Err: ctx.Err()}
	}
	var devices []kubeletplugin.Device
	var names, uuids []string
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != driverName {
			continue
		}
		if r.Pool != s.opts.nodeName {
			say("prepare %s error=device %s/%s is not this node's", who, r.Pool, r.Device)
			return kubeletplugin.PrepareResult{Err: fmt.Errorf("device %s of pool %s is not on node %s", r.Device, r.Pool, s.opts.nodeName)}
		}
		names = append(names, r.Device)
		uuids = append(uuids, s.uuid(r.Device))
		devices = append(devices, kubeletplugin.Device{
			Requests:     []string{r.Request},
			PoolName:     r.Pool,
			DeviceName:   r.Device,
			CDIDeviceIDs: []string{fmt.Sprintf("%s=%s", cdiKind, claim.UID)},
		})
	}
	sort.Strings(uuids)
	spec := cdiSpec{
		Version: "0.6.0",
		Kind:    cdiKind,
		Devices: []cdiDevice{{
			Name: string(claim.UID),
			ContainerEdits: cdiEdits{Env: []string{
				"NVIDIA_VISIBLE_DEVICES=" + strings.Join(uuids, ","),
				"GPU_DRA_STANDIN_CLAIM=" + string(claim.UID),
			}},
		}},
	}
	data, err := json.Marshal(spec)
	if err == nil {
		s.mu.Lock()
		err = writeFileAtomically(s.specPath(claim.UID), data)
		s.mu.Unlock()
	}
	if err != nil {
		say("prepare %s error=%q", who, err)
		return kubeletplugin.PrepareResult{Err: err}
	}
	say("prepare %s devices=%s uuids=%s cdi=%s", who, strings.Join(names, ","), strings.Join(uuids, ","), s.specPath(claim.UID))
	return kubeletplugin.PrepareResult{Devices: devices}
}

func writeFileAtomically(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func (s *standIn) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	result := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		s.mu.Lock()
		err := os.Remove(s.specPath(claim.UID))
		s.mu.Unlock()
		if errors.Is(err, os.ErrNotExist) {
			// Not prepared here (or already unprepared): nothing to undo.
			err = nil
		}
		if err != nil {
			say("unprepare claim=%s/%s uid=%s error=%q", claim.Namespace, claim.Name, claim.UID, err)
		} else {
			say("unprepare claim=%s/%s uid=%s", claim.Namespace, claim.Name, claim.UID)
		}
		result[claim.UID] = err
	}
	return result, nil
}

func (s *standIn) HandleError(_ context.Context, err error, msg string) {
	say("error %s: %q", msg, err)
}

// devices are the node's GPUs as the driver describes them.
func (s *standIn) devices() ([]resourceapi.Device, error) {
	memory, err := resource.ParseQuantity(s.opts.memory)
	if err != nil {
		return nil, fmt.Errorf("--memory %q: %w", s.opts.memory, err)
	}
	devices := make([]resourceapi.Device, 0, s.opts.gpus)
	for minor := 0; minor < s.opts.gpus; minor++ {
		name := fmt.Sprintf("gpu-%d", minor)
		attributes := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type":          {StringValue: ptr.To("gpu")},
			"uuid":          {StringValue: ptr.To(s.uuid(name))},
			"productName":   {StringValue: ptr.To(s.opts.product)},
			"architecture":  {StringValue: ptr.To("Hopper")},
			"driverVersion": {VersionValue: ptr.To("580.95.5")},
		}
		if s.opts.addressingMode != "" {
			attributes["addressingMode"] = resourceapi.DeviceAttribute{StringValue: ptr.To(s.opts.addressingMode)}
		}
		devices = append(devices, resourceapi.Device{
			Name:       name,
			Attributes: attributes,
			Capacity:   map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: memory}},
		})
	}
	return devices, nil
}

func run(ctx context.Context, opts options) error {
	if opts.nodeName == "" {
		return errors.New("--node-name is required")
	}
	if opts.gpus < 1 {
		return fmt.Errorf("--gpus %d: at least one GPU", opts.gpus)
	}
	config, err := clientcmd.BuildConfigFromFlags("", opts.kubeconfig)
	if err != nil {
		return fmt.Errorf("--kubeconfig %q: %w", opts.kubeconfig, err)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(opts.cdiDir, 0o755); err != nil {
		return err
	}
	pluginDir := filepath.Join(opts.kubeletRoot, "plugins", driverName)
	if err := os.MkdirAll(pluginDir, 0o750); err != nil {
		return err
	}
	plugin := &standIn{opts: opts}
	devices, err := plugin.devices()
	if err != nil {
		return err
	}
	helper, err := kubeletplugin.Start(ctx, plugin,
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(opts.nodeName),
		kubeletplugin.DriverName(driverName),
		kubeletplugin.PluginDataDirectoryPath(pluginDir),
		kubeletplugin.RegistrarDirectoryPath(filepath.Join(opts.kubeletRoot, "plugins_registry")),
		// The driver's calls may overlap (a hanging prepare must not block an unprepare).
		kubeletplugin.Serialize(false),
	)
	if err != nil {
		return fmt.Errorf("starting the kubelet plugin: %w", err)
	}
	defer helper.Stop()

	var slices []resourceslice.Slice
	for first := 0; first < len(devices); first += maxDevices {
		last := min(first+maxDevices, len(devices))
		slices = append(slices, resourceslice.Slice{Devices: devices[first:last]})
	}
	if err := helper.PublishResources(ctx, resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{opts.nodeName: {Slices: slices}},
	}); err != nil {
		return fmt.Errorf("publishing the ResourceSlices: %w", err)
	}
	say("published node=%s devices=%d slices=%d addressingMode=%q memory=%s", opts.nodeName, len(devices), len(slices), opts.addressingMode, opts.memory)

	// The kubelet's answer to the registration, once it comes.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	registered := false
	for {
		select {
		case <-ctx.Done():
			say("stopping")
			return nil
		case <-tick.C:
			if status := helper.RegistrationStatus(); status != nil && !registered {
				if status.PluginRegistered {
					say("registered")
				} else {
					say("registration refused: %s", status.Error)
				}
				registered = true
			}
		}
	}
}

func main() {
	var opts options
	flag.StringVar(&opts.kubeconfig, "kubeconfig", "", "kubeconfig of the API server")
	flag.StringVar(&opts.nodeName, "node-name", "", "the node this plugin runs on")
	flag.StringVar(&opts.kubeletRoot, "kubelet-root", "/var/lib/kubelet", "the kubelet's root directory (plugins and plugins_registry are below it)")
	flag.StringVar(&opts.cdiDir, "cdi-dir", "/var/run/cdi", "where the container runtime reads CDI spec files")
	flag.IntVar(&opts.gpus, "gpus", 2, "GPUs to publish")
	flag.StringVar(&opts.product, "product", "NVIDIA H200", "each GPU's productName")
	flag.StringVar(&opts.memory, "memory", "143771Mi", "each GPU's memory capacity")
	flag.StringVar(&opts.addressingMode, "addressing-mode", "None", "each GPU's addressingMode (ATS, HMM, None; empty: no attribute)")
	flag.BoolVar(&opts.hangOnPrepare, "hang-on-prepare", false, "never answer a prepare call (to test a plugin dying mid-prepare)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, opts); err != nil {
		fmt.Fprintf(os.Stderr, "gpu-dra-standin: %v\n", err)
		os.Exit(1)
	}
}

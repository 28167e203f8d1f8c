// Command kubeletstub is the kubelet's half of the device plugin API (v1beta1), and nothing
// else: the tests run NVIDIA's device plugin against it to check what the plugin registers,
// advertises and allocates without a kubelet. It serves the Registration service on
// <dir>/kubelet.sock; when a plugin registers, it dials the plugin's endpoint in <dir>, prints
// the registration and every ListAndWatch update as one JSON line each on stdout, and answers
// lines on stdin:
//
//	allocate <resource> <device id>...   -> {"allocate": <AllocateResponse>} or {"error": "..."}
//	prefer <resource> <size> <device id>... -> {"prefer": <GetPreferredAllocationResponse>} (of the
//	                                           ids given, as the kubelet asks before Allocate)
//
// The real kubelet replaces it on the real node.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type stub struct {
	pluginapi.UnimplementedRegistrationServer
	dir     string
	mu      sync.Mutex
	out     *json.Encoder
	plugins map[string]pluginapi.DevicePluginClient // resource name -> the plugin serving it
}

func (s *stub) print(key string, value any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = s.out.Encode(map[string]any{key: value})
}

func (s *stub) Register(_ context.Context, request *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	if request.Version != pluginapi.Version {
		return nil, fmt.Errorf("unsupported device plugin API version %q", request.Version)
	}
	s.print("register", request)
	go s.follow(request)
	return &pluginapi.Empty{}, nil
}

// follow dials a registered plugin and prints its ListAndWatch updates until the stream ends.
func (s *stub) follow(request *pluginapi.RegisterRequest) {
	endpoint := filepath.Join(s.dir, request.Endpoint)
	connection, err := grpc.NewClient("unix://"+endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		s.print("error", fmt.Sprintf("dial %s: %v", endpoint, err))
		return
	}
	client := pluginapi.NewDevicePluginClient(connection)
	s.mu.Lock()
	s.plugins[request.ResourceName] = client
	s.mu.Unlock()
	stream, err := client.ListAndWatch(context.Background(), &pluginapi.Empty{})
	if err != nil {
		s.print("error", fmt.Sprintf("ListAndWatch %s: %v", request.ResourceName, err))
		return
	}
	for {
		update, err := stream.Recv()
		if err != nil {
			s.print("error", fmt.Sprintf("ListAndWatch %s ended: %v", request.ResourceName, err))
			return
		}
		s.print("devices", map[string]any{"resource": request.ResourceName, "devices": update.Devices})
	}
}

func (s *stub) client(resource string) pluginapi.DevicePluginClient {
	s.mu.Lock()
	defer s.mu.Unlock()
	client := s.plugins[resource]
	if client == nil {
		_ = s.out.Encode(map[string]any{"error": fmt.Sprintf("no plugin registered %s", resource)})
	}
	return client
}

func (s *stub) allocate(resource string, ids []string) {
	client := s.client(resource)
	if client == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	request := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIDs: ids}}}
	response, err := client.Allocate(ctx, request)
	if err != nil {
		s.print("error", fmt.Sprintf("Allocate %s %v: %v", resource, ids, err))
		return
	}
	s.print("allocate", response)
}

func (s *stub) prefer(resource string, size int32, ids []string) {
	client := s.client(resource)
	if client == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	request := &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: ids, AllocationSize: size},
	}}
	response, err := client.GetPreferredAllocation(ctx, request)
	if err != nil {
		s.print("error", fmt.Sprintf("GetPreferredAllocation %s %v: %v", resource, ids, err))
		return
	}
	s.print("prefer", response)
}

func main() {
	dir := flag.String("dir", pluginapi.DevicePluginPath, "the device plugin directory: kubelet.sock and the plugins' sockets")
	flag.Parse()
	socket := filepath.Join(*dir, "kubelet.sock")
	_ = os.Remove(socket)
	listener, err := net.Listen("unix", socket)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	s := &stub{dir: *dir, out: json.NewEncoder(os.Stdout), plugins: map[string]pluginapi.DevicePluginClient{}}
	server := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(server, s)
	go func() {
		lines := bufio.NewScanner(os.Stdin)
		for lines.Scan() {
			words := strings.Fields(lines.Text())
			size := 0
			if len(words) >= 3 && words[0] == "allocate" {
				s.allocate(words[1], words[2:])
			} else if len(words) >= 4 && words[0] == "prefer" {
				if _, err := fmt.Sscan(words[2], &size); err != nil {
					s.print("error", fmt.Sprintf("not a size: %q", words[2]))
					continue
				}
				s.prefer(words[1], int32(size), words[3:])
			} else if len(words) > 0 {
				s.print("error", fmt.Sprintf("unknown command %q", lines.Text()))
			}
		}
		server.Stop() // stdin closed: the test is done
	}()
	s.print("listening", socket)
	if err := server.Serve(listener); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

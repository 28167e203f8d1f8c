package main

// The feature gates our DRA documentation (docs/dra.md) tells administrators to turn on for the
// presets, on every component. A gate this Kubernetes version does not know (not yet, or removed
// after graduating) or has locked at the value wanted is left out, so one list serves every
// version this program is built against.

import (
	"fmt"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/util/sets"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/component-base/featuregate"
)

var wantedGates = map[featuregate.Feature]bool{
	"DRAConsumableCapacity":   true, // several claims share one device (KEP-5075): timeslice, mps, vgpu
	"DRAPartitionableDevices": true, // MIG devices published as partitions of a card (KEP-4815)
	"DRAPrioritizedList":      true, // firstAvailable: c.GPUShare.dra_fallbacks (KEP-4816)
}

// featureGates is the --feature-gates value for this version; it fails on nothing but says
// what it leaves out.
func featureGates() (string, error) {
	known := utilfeature.DefaultMutableFeatureGate.GetAll()
	var set []string
	skipped := sets.New[string]()
	for gate, on := range wantedGates {
		spec, ok := known[gate]
		if !ok || (spec.LockToDefault && spec.Default == on) {
			skipped.Insert(string(gate))
			continue
		}
		set = append(set, fmt.Sprintf("%s=%t", gate, on))
	}
	sort.Strings(set)
	if skipped.Len() > 0 {
		fmt.Printf("feature gates not set (unknown to this version, or always on): %s\n", strings.Join(sets.List(skipped), ", "))
	}
	return strings.Join(set, ","), nil
}

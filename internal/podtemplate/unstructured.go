package podtemplate

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Reading and editing RayCluster fields as unstructured data, without KubeRay's Go types (which would
// drop fields they do not know): every field may have the wrong type, which is an error, never a panic.

// envEntry is one environment variable raysync wants in a named list.
type envEntry struct{ name, value string }

// ensureEntries reports whether env list field of obj lacks any of wants with exactly their value
// (a valueFrom does not count), in one pass over the list: autoscaler env lists can be long. With
// mutate it appends what is missing and replaces what is wrong.
func ensureEntries(obj map[string]any, field string, wants []envEntry, mutate bool) (bool, error) {
	list, err := namedList(obj, field)
	if err != nil {
		return false, err
	}
	const ok, wrong = 1, 2
	var buf [8]uint8
	state := buf[:0]
	if len(wants) > len(buf) {
		state = make([]uint8, 0, len(wants))
	}
	state = state[:len(wants)]
	for i, e := range list {
		m := e.(map[string]any) // namedList checked
		name, _ := m["name"].(string)
		for j, w := range wants {
			if w.name != name || state[j] != 0 {
				continue
			}
			v, isString := m["value"].(string)
			_, from := m["valueFrom"]
			if isString && v == w.value && !from {
				state[j] = ok
			} else {
				state[j] = wrong
				if mutate {
					list[i] = map[string]any{"name": w.name, "value": w.value}
				}
			}
			break
		}
	}
	changed := false
	for j, w := range wants {
		if state[j] == ok {
			continue
		}
		changed = true
		if state[j] == 0 && mutate {
			list = append(list, map[string]any{"name": w.name, "value": w.value})
		}
	}
	if mutate && changed {
		obj[field] = list
	}
	return changed, nil
}

// namedList returns list field of obj, checking that it is a list of objects.
func namedList(obj map[string]any, field string) ([]any, error) {
	raw := obj[field]
	if raw == nil {
		return nil, nil
	}
	list, isList := raw.([]any)
	if !isList {
		return nil, fmt.Errorf("%s is not a list", field)
	}
	for i, e := range list {
		if _, isMap := e.(map[string]any); !isMap {
			return nil, fmt.Errorf("%s[%d] is not an object", field, i)
		}
	}
	return list, nil
}

// podSpecs returns the head's pod spec, then each worker group's (nil maps where absent and !mutate).
func podSpecs(obj map[string]any, mutate bool) ([]map[string]any, error) {
	head, err := objectAt(obj, mutate, "spec", "headGroupSpec", "template", "spec")
	if err != nil {
		return nil, err
	}
	workers, found, err := unstructured.NestedFieldNoCopy(obj, "spec", "workerGroupSpecs")
	if err != nil {
		return nil, fmt.Errorf("spec.workerGroupSpecs: %w", err)
	}
	if !found || workers == nil {
		return []map[string]any{head}, nil
	}
	list, ok := workers.([]any)
	if !ok {
		return nil, fmt.Errorf("spec.workerGroupSpecs is not a list")
	}
	specs := append(make([]map[string]any, 0, 1+len(list)), head)
	for i, w := range list {
		wm, ok := w.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("spec.workerGroupSpecs[%d] is not an object", i)
		}
		ps, err := objectAt(wm, mutate, "template", "spec")
		if err != nil {
			return nil, fmt.Errorf("spec.workerGroupSpecs[%d].%w", i, err)
		}
		specs = append(specs, ps)
	}
	return specs, nil
}

// podSpecsOf is podSpecs for reading only, skipping whatever is malformed.
func podSpecsOf(obj map[string]any) []map[string]any {
	specs, err := podSpecs(obj, false)
	if err != nil {
		return nil
	}
	return specs
}

// listOf returns the objects in a list field, skipping entries that are not objects.
func listOf(obj map[string]any, field string) []map[string]any {
	list, _ := obj[field].([]any)
	out := make([]map[string]any, 0, len(list))
	for _, e := range list {
		if m, ok := e.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

// ensureNamedEntry reports whether list field of obj lacks an entry named name that ok accepts
// (nil: any entry with that name is fine). With mutate it appends want(), or replaces the rejected entry.
func ensureNamedEntry(obj map[string]any, field, name string, want func() map[string]any, ok func(map[string]any) bool, mutate bool) (bool, error) {
	list, err := namedList(obj, field)
	if err != nil {
		return false, err
	}
	for i, e := range list {
		m := e.(map[string]any) // namedList checked
		if m["name"] != name {
			continue
		}
		if ok == nil || ok(m) {
			return false, nil
		}
		if mutate {
			list[i] = want()
		}
		return true, nil
	}
	if mutate {
		obj[field] = append(list, want())
	}
	return true, nil
}

// objectAt returns the object at path; with mutate it creates empty objects along the way, without
// it a missing object is nil (reads of a nil map are empty).
func objectAt(obj map[string]any, mutate bool, fields ...string) (map[string]any, error) {
	cur := obj
	for i, f := range fields {
		next, ok := cur[f]
		if !ok || next == nil {
			if !mutate {
				return nil, nil
			}
			m := map[string]any{}
			cur[f] = m
			cur = m
			continue
		}
		m, isMap := next.(map[string]any)
		if !isMap {
			return nil, fmt.Errorf("%s is not an object", strings.Join(fields[:i+1], "."))
		}
		cur = m
	}
	return cur, nil
}

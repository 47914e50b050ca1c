package manifests

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Kit is the decoded manifests of one directory, by kind.
type Kit struct {
	StatefulSets []*appsv1.StatefulSet
	Services     []*corev1.Service
	ConfigMaps   []*corev1.ConfigMap
	PDBs         []*policyv1.PodDisruptionBudget
	// file names the file each object came from, for error messages.
	file map[any]string
}

// LoadDir decodes every *.yaml and *.yml file of dir (what
// `kubectl apply -f dir` applies) into a Kit.
func LoadDir(dir string) (*Kit, error) {
	files := map[string][]byte{}
	for _, pat := range []string{"*.yaml", "*.yml"} {
		names, err := filepath.Glob(filepath.Join(dir, pat))
		if err != nil {
			return nil, err
		}
		for _, n := range names {
			b, err := os.ReadFile(n)
			if err != nil {
				return nil, err
			}
			files[filepath.Base(n)] = b
		}
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s: no *.yaml manifests", dir)
	}
	return Decode(files)
}

// Decode decodes the manifests given as file name → content. A file may
// hold several documents separated by "---" lines.
func Decode(files map[string][]byte) (*Kit, error) {
	k := &Kit{file: map[any]string{}}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	var errs []error
	for _, name := range names {
		for i, doc := range splitDocuments(files[name]) {
			where := name
			if i > 0 {
				where = fmt.Sprintf("%s (document %d)", name, i+1)
			}
			if err := k.decodeOne(where, doc); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return k, nil
}

// splitDocuments splits a YAML stream at its "---" separator lines and
// drops the documents that hold only comments or blank lines.
func splitDocuments(b []byte) [][]byte {
	var docs [][]byte
	var cur []byte
	flush := func() {
		for _, l := range bytes.Split(cur, []byte("\n")) {
			if t := bytes.TrimSpace(l); len(t) > 0 && t[0] != '#' {
				docs = append(docs, cur)
				break
			}
		}
		cur = nil
	}
	for _, l := range bytes.SplitAfter(b, []byte("\n")) {
		if t := bytes.TrimRight(l, " \t\r\n"); bytes.Equal(t, []byte("---")) || bytes.HasPrefix(t, []byte("--- ")) {
			flush()
			continue
		}
		cur = append(cur, l...)
	}
	flush()
	return docs
}

func (k *Kit) decodeOne(where string, doc []byte) error {
	// YAMLToJSONStrict refuses duplicate keys, which YAML allows and which
	// would silently keep the last value.
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	var tm struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := kjson.UnmarshalCaseSensitivePreserveInts(js, &tm); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	var obj any
	switch tm.APIVersion + " " + tm.Kind {
	case "apps/v1 StatefulSet":
		o := &appsv1.StatefulSet{}
		k.StatefulSets, obj = append(k.StatefulSets, o), o
	case "v1 Service":
		o := &corev1.Service{}
		k.Services, obj = append(k.Services, o), o
	case "v1 ConfigMap":
		o := &corev1.ConfigMap{}
		k.ConfigMaps, obj = append(k.ConfigMaps, o), o
	case "policy/v1 PodDisruptionBudget":
		o := &policyv1.PodDisruptionBudget{}
		k.PDBs, obj = append(k.PDBs, o), o
	default:
		return fmt.Errorf("%s: apiVersion %q kind %q: not a kind this check knows (apps/v1 StatefulSet, v1 Service, v1 ConfigMap, policy/v1 PodDisruptionBudget)", where, tm.APIVersion, tm.Kind)
	}
	// The API server's own strict decoder (its field validation): unknown
	// fields by their path, duplicate fields, and names matched case-
	// sensitively. encoding/json's DisallowUnknownFields matches field names
	// case-insensitively, so it would take "ServiceName" for "serviceName";
	// the API server would not (kubectl apply warns, or fails with
	// --validate=strict).
	strict, err := kjson.UnmarshalStrict(js, obj, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return fmt.Errorf("%s: %s: %w", where, tm.Kind, err)
	}
	if len(strict) > 0 {
		msgs := make([]string, len(strict))
		for i, e := range strict {
			msgs[i] = e.Error()
		}
		return fmt.Errorf("%s: %s: %s", where, tm.Kind, strings.Join(msgs, "; "))
	}
	k.file[obj] = where
	return nil
}

// where names an object for an error message: its file, kind and name.
func (k *Kit) where(obj any) string {
	switch o := obj.(type) {
	case *appsv1.StatefulSet:
		return fmt.Sprintf("%s: StatefulSet %s", k.file[obj], o.Name)
	case *corev1.Service:
		return fmt.Sprintf("%s: Service %s", k.file[obj], o.Name)
	case *corev1.ConfigMap:
		return fmt.Sprintf("%s: ConfigMap %s", k.file[obj], o.Name)
	case *policyv1.PodDisruptionBudget:
		return fmt.Sprintf("%s: PodDisruptionBudget %s", k.file[obj], o.Name)
	}
	return fmt.Sprint(obj)
}

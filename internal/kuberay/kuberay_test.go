package kuberay

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"
)

func TestCheckName(t *testing.T) {
	long := "a-very-long-raycluster-name-that-goes-past-fifty-chars" // 54
	tests := map[string]struct{ in, want string }{
		"normal":                       {"my-cluster", "my-cluster"},
		"exactly 50":                   {strings.Repeat("a", 50), strings.Repeat("a", 50)},
		"51 keeps last 50":             {"b" + strings.Repeat("a", 50), strings.Repeat("a", 50)},
		"over 50 keeps the suffix":     {long, long[4:]},
		"63 characters":                {strings.Repeat("x", 13) + strings.Repeat("y", 50), strings.Repeat("y", 50)},
		"leading digit":                {"1cluster", "rcluster"},
		"all digits":                   {"123", "r23"},
		"punctuation after truncation": {strings.Repeat("a", 10) + "-" + strings.Repeat("b", 49), "r" + strings.Repeat("b", 49)},
		"digit after truncation":       {strings.Repeat("a", 10) + "7" + strings.Repeat("b", 49), "r" + strings.Repeat("b", 49)},
		"rayservice blue-green name":   {"ml-inference-abcde", "ml-inference-abcde"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := CheckName(tc.in); got != tc.want {
				t.Errorf("CheckName(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestValidClusterName(t *testing.T) {
	for name, want := range map[string]bool{
		"a": true, "my-cluster": true, strings.Repeat("a", 53): true,
		strings.Repeat("a", 54): false, strings.Repeat("a", 63): false, "1abc": false, "-abc": false,
		"abc-": false, "a.b": false, "ABC": false, "": false,
	} {
		if got := ValidClusterName(name); got != want {
			t.Errorf("ValidClusterName(%q) = %v, want %v", name, got, want)
		}
	}
}

// FuzzCheckName: for every valid RayCluster name, the result is a valid Secret name of at most 50
// characters that is a suffix of the input except for its first character.
func FuzzCheckName(f *testing.F) {
	for _, s := range []string{"a", "1a", "my-cluster", strings.Repeat("ab-", 21), "a.b.c", "0-0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if len(validation.IsDNS1123Subdomain(name)) > 0 || len(name) > 63 {
			t.Skip()
		}
		got := CheckName(name)
		if len(got) > 50 || len(got) == 0 {
			t.Fatalf("CheckName(%q) = %q: length %d", name, got, len(got))
		}
		if !strings.HasSuffix(name, got[1:]) {
			t.Fatalf("CheckName(%q) = %q is not a suffix", name, got)
		}
		if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
			t.Fatalf("CheckName(%q) = %q is not a valid Secret name: %v", name, got, errs)
		}
	})
}

func TestReadAuthOptions(t *testing.T) {
	tests := map[string]struct {
		spec      any
		tokenAuth bool
		secret    string
		wantErr   bool
	}{
		"no spec":                 {spec: nil},
		"no authOptions":          {spec: map[string]any{}},
		"null authOptions":        {spec: map[string]any{"authOptions": nil}},
		"mode token":              {spec: map[string]any{"authOptions": map[string]any{"mode": "token"}}, tokenAuth: true},
		"mode disabled":           {spec: map[string]any{"authOptions": map[string]any{"mode": "disabled"}}},
		"empty mode":              {spec: map[string]any{"authOptions": map[string]any{}}},
		"k8s token auth":          {spec: map[string]any{"authOptions": map[string]any{"mode": "token", "enableK8sTokenAuth": true}}},
		"k8s token auth false":    {spec: map[string]any{"authOptions": map[string]any{"mode": "token", "enableK8sTokenAuth": false}}, tokenAuth: true},
		"secretName":              {spec: map[string]any{"authOptions": map[string]any{"mode": "token", "secretName": "shared"}}, tokenAuth: true, secret: "shared"},
		"authOptions is a string": {spec: map[string]any{"authOptions": "token"}, wantErr: true},
		"mode is a number":        {spec: map[string]any{"authOptions": map[string]any{"mode": int64(1)}}, wantErr: true},
		"secretName is a list":    {spec: map[string]any{"authOptions": map[string]any{"mode": "token", "secretName": []any{"x"}}}, wantErr: true},
		"spec is a string":        {spec: "oops", wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			obj := map[string]any{}
			if tc.spec != nil {
				obj["spec"] = tc.spec
			}
			a := ReadAuthOptions(&unstructured.Unstructured{Object: obj})
			if (a.Err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", a.Err, tc.wantErr)
			}
			if a.TokenAuth() != tc.tokenAuth || a.SecretName != tc.secret {
				t.Errorf("TokenAuth()=%v SecretName=%q, want %v %q", a.TokenAuth(), a.SecretName, tc.tokenAuth, tc.secret)
			}
		})
	}
}

// FuzzValidClusterName: the hand-written check is exactly KubeRay's rule (a DNS-1035 label of at
// most 53 characters).
func FuzzValidClusterName(f *testing.F) {
	for _, s := range []string{"a", "a-b", "1a", "-a", "a-", "A", "a.b", "", strings.Repeat("a", 54), "a\u00e9"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		want := len(name) <= MaxClusterNameLength && len(validation.IsDNS1035Label(name)) == 0
		if got := ValidClusterName(name); got != want {
			t.Fatalf("ValidClusterName(%q) = %v, want %v", name, got, want)
		}
	})
}

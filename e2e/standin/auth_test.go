package standin

import (
	"net/http"
	"testing"
)

func TestPresentedTokenFollowsRaysOrder(t *testing.T) {
	tests := map[string]struct {
		headers map[string]string
		want    string
		found   bool
	}{
		"nothing":                         {nil, "", false},
		"Authorization Bearer":            {map[string]string{"Authorization": "Bearer a"}, "a", true},
		"X-Ray-Authorization Bearer":      {map[string]string{"X-Ray-Authorization": "Bearer b"}, "b", true},
		"X-Ray-Authorization bare":        {map[string]string{"X-Ray-Authorization": "b"}, malformedToken, true},
		"Authorization bare":              {map[string]string{"Authorization": "a"}, malformedToken, true},
		"Authorization lower-case":        {map[string]string{"Authorization": "bearer a"}, malformedToken, true},
		"wrong Authorization hides X-Ray": {map[string]string{"Authorization": "Bearer w", "X-Ray-Authorization": "Bearer b"}, "w", true},
		"cookie":                          {map[string]string{"Cookie": "other=x; ray-authentication-token=c"}, "c", true},
		"Authorization wins over X-Ray":   {map[string]string{"Authorization": "Bearer a", "X-Ray-Authorization": "Bearer b"}, "a", true},
		"X-Ray wins over the cookie":      {map[string]string{"X-Ray-Authorization": "Bearer b", "Cookie": "ray-authentication-token=c"}, "b", true},
		"Authorization wins over cookie":  {map[string]string{"Authorization": "Bearer a", "Cookie": "ray-authentication-token=c"}, "a", true},
		"Basic auth is not a Ray token":   {map[string]string{"Authorization": "Basic eDp5", "Cookie": "ray-authentication-token=c"}, malformedToken, true},
		"empty cookie":                    {map[string]string{"Cookie": "ray-authentication-token="}, "", false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tc.headers {
				h.Set(k, v)
			}
			got, found := presentedToken(h)
			if got != tc.want || found != tc.found {
				t.Errorf("presentedToken = %q, %v; want %q, %v", got, found, tc.want, tc.found)
			}
		})
	}
}

func TestRayAuthAcceptsExactlyOneToken(t *testing.T) {
	fp := testFingerprinter(t)
	right, wrong := fp.mac("right"), fp.mac("wrong")
	on := rayAuth{enabled: true, token: right}
	tests := map[string]struct {
		auth      rayAuth
		presented *tokenMAC
		want      verdict
		status    int
	}{
		"right token":             {on, &right, accepted, http.StatusOK},
		"wrong token":             {on, &wrong, forbidden, http.StatusForbidden},
		"no token":                {on, nil, unauthenticated, http.StatusUnauthorized},
		"auth off takes anything": {rayAuth{}, &wrong, accepted, http.StatusOK},
		"auth off takes no token": {rayAuth{}, nil, accepted, http.StatusOK},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := tc.auth.check(tc.presented); got != tc.want || got.httpStatus() != tc.status {
				t.Errorf("check = %s (HTTP %d), want %s (HTTP %d)", got, got.httpStatus(), tc.want, tc.status)
			}
		})
	}
}

func TestFingerprintNeedsTheKey(t *testing.T) {
	a, b := testFingerprinter(t), testFingerprinter(t)
	if a.Fingerprint("tok") != a.Fingerprint("tok") {
		t.Fatal("fingerprint not stable")
	}
	if a.Fingerprint("tok") == b.Fingerprint("tok") {
		t.Error("two keys gave the same fingerprint: it would not be keyed")
	}
	if a.Fingerprint("tok") == a.Fingerprint("tok2") {
		t.Error("two tokens, one fingerprint")
	}
	if _, err := NewFingerprinter(make([]byte, 16)); err == nil {
		t.Error("a 16-byte key was accepted")
	}
}

func testFingerprinter(t *testing.T) *Fingerprinter {
	t.Helper()
	path := t.TempDir() + "/key"
	if err := WriteKey(path); err != nil {
		t.Fatal(err)
	}
	fp, err := LoadFingerprinter(path)
	if err != nil {
		t.Fatal(err)
	}
	return fp
}

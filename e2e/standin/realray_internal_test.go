package standin

import "testing"

func TestExpandLikeTheKubelet(t *testing.T) {
	env := map[string]string{"RAY_CLUSTER_NAME": "c1", "EMPTY": ""}
	for in, want := range map[string]string{
		"--cluster-name $(RAY_CLUSTER_NAME)": "--cluster-name c1",
		"$(EMPTY)x":                          "x",
		"$(NOT_SET) stays":                   "$(NOT_SET) stays",
		"$$(RAY_CLUSTER_NAME) is escaped":    "$(RAY_CLUSTER_NAME) is escaped",
		"a $ alone, $$ twice":                "a $ alone, $ twice",
		"unclosed $(RAY":                     "unclosed $(RAY",
		"trailing $":                         "trailing $",
	} {
		if got := expand(in, env); got != want {
			t.Errorf("expand(%q) = %q, want %q", in, got, want)
		}
	}
}

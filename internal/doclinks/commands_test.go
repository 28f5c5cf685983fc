package doclinks

import "testing"

func TestCommands(t *testing.T) {
	page := "intro\n```sh\n$ agentbox audit verify DIR\nagentbox sandbox suspend --name r \\\n  --pod a/b   # stop\nagentbox install [--root / | --host-root /host]\nkubectl get pods\n```\nagentbox outside a block\n"
	got := Commands([]File{{Path: "docs/x.md", Text: page}}, "agentbox")
	want := []Command{
		{"docs/x.md:3", "agentbox audit verify DIR"},
		{"docs/x.md:4", "agentbox sandbox suspend --name r  --pod a/b   # stop"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %q", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("%d: got %q, want %q", i, got[i], want[i])
		}
	}
}

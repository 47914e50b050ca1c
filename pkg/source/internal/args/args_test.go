package args_test

import (
	"testing"

	"github.com/tidemark/tidemark/pkg/source/internal/args"
)

func TestCheck(t *testing.T) {
	g, one := "g", []string{"x:1"}
	cases := []struct {
		name    string
		brokers []string
		group   string
		topics  []string
		want    *args.Problem // nil: accepted
	}{
		{"valid", one, g, []string{"t", "u"}, nil},
		{"no broker before the rest", nil, "", nil, &args.Problem{"brokers", "no seed broker"}},
		{"empty group before no topic", one, "", nil, &args.Problem{"group", "empty group"}},
		{"no topic", one, g, nil, &args.Problem{"topics", "no topic"}},
		{"empty broker before a bad topic", []string{"x:1", ""}, g, []string{""}, &args.Problem{"brokers", "broker 1 is empty"}},
		{"empty broker", []string{""}, g, []string{"t"}, &args.Problem{"brokers", "broker 0 is empty"}},
		{"empty topic", one, g, []string{"t", ""}, &args.Problem{"topics", "topic 1 is empty"}},
		{"lowest index first", one, g, []string{"t", "u", "t", ""}, &args.Problem{"topics", `topic "t" given twice`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := args.Check(tc.brokers, tc.group, tc.topics)
			if (got == nil) != (tc.want == nil) || got != nil && *got != *tc.want {
				t.Fatalf("Check(%q, %q, %q) = %+v, want %+v", tc.brokers, tc.group, tc.topics, got, tc.want)
			}
		})
	}
}

type balancer interface{ Name() string }

type named string

func (n named) Name() string { return string(n) }

func TestBalancers(t *testing.T) {
	for _, tc := range []struct {
		bs   []balancer
		want string
	}{
		{[]balancer{named("range")}, ""},
		{nil, "no balancer given"},
		{[]balancer{}, "no balancer given"},
		{[]balancer{named("range"), nil}, "balancer 1 is nil"},
	} {
		if got := args.Balancers(tc.bs); got != tc.want {
			t.Errorf("Balancers(%v) = %q, want %q", tc.bs, got, tc.want)
		}
	}
}

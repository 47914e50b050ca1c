// Package args checks what both source adapters' New are given: the seed
// brokers, the consumer group, the topics and a balancer list. It returns
// what is wrong as an option name and a reason, and each adapter wraps
// them in its own *ConfigError, so that every message keeps the adapter's
// prefix ("franz: option topics: no topic").
package args

import (
	"fmt"
	"slices"
)

// Problem is an invalid argument: Option names it, Reason says what is
// wrong with it.
type Problem struct {
	Option string
	Reason string
}

// Check returns the first problem with New's arguments, or nil: no broker,
// an empty group, no topic, then an empty broker address (franz-go would
// dial it as localhost:9092), then an empty topic or one given twice, the lowest index first.
func Check(brokers []string, group string, topics []string) *Problem {
	switch {
	case len(brokers) == 0:
		return &Problem{"brokers", "no seed broker"}
	case group == "":
		return &Problem{"group", "empty group"}
	case len(topics) == 0:
		return &Problem{"topics", "no topic"}
	}
	for i, b := range brokers {
		if b == "" {
			return &Problem{"brokers", fmt.Sprintf("broker %d is empty", i)}
		}
	}
	for i, t := range topics {
		if t == "" {
			return &Problem{"topics", fmt.Sprintf("topic %d is empty", i)}
		}
		if slices.Contains(topics[:i], t) {
			return &Problem{"topics", fmt.Sprintf("topic %q given twice", t)}
		}
	}
	return nil
}

// Balancers returns why a balancer list given as an option is unusable:
// empty, or holding a nil balancer; "" if it is usable. B is the client's
// balancer interface.
func Balancers[B any](bs []B) string {
	if len(bs) == 0 {
		return "no balancer given"
	}
	for i, b := range bs {
		if any(b) == nil {
			return fmt.Sprintf("balancer %d is nil", i)
		}
	}
	return ""
}

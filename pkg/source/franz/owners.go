package franz

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/tidemark/tidemark/pkg/runner"
)

// PartitionOwners returns, for each of tps, the member id of the member of
// group that the group coordinator's current assignment gives it to; a
// partition no member has is missing from the map. It asks with the
// Source's client: ConsumerGroupDescribe for a KIP-848 group (each member's
// current assignment; a partition is in one member's at most, also while
// the group reconciles), DescribeGroups for a classic one, whose
// assignment is settled only while the group is Stable — in any other
// state it returns an error rather than a guess. It implements
// inbox.Coordinator (pass the Source to inbox.Owners). It is safe for
// concurrent use and does not wait for Run; ctx bounds the requests.
func (s *Source) PartitionOwners(ctx context.Context, group string, tps []runner.TP) (map[runner.TP]string, error) {
	adm := kadm.NewClient(s.cl)
	if s.cfg.serverSide {
		owners, err := consumerGroupOwners(ctx, adm, group, tps)
		// A broker without KIP-848 (the client then runs the classic
		// protocol) or a group that is not a consumer group: ask the
		// classic way.
		if err == nil || !(errors.Is(err, kerr.GroupIDNotFound) || errors.Is(err, kerr.UnsupportedVersion)) {
			return owners, err
		}
	}
	return classicOwners(ctx, adm, group, tps)
}

func consumerGroupOwners(ctx context.Context, adm *kadm.Client, group string, tps []runner.TP) (map[runner.TP]string, error) {
	described, err := adm.DescribeConsumerGroups(ctx, group)
	if err == nil {
		err = described[group].Err
	}
	if err != nil {
		return nil, fmt.Errorf("franz: describing consumer group %s: %w", group, err)
	}
	out := make(map[runner.TP]string, len(tps))
	for _, m := range described[group].Members {
		for _, tp := range tps {
			if ps, ok := m.Assignment[tp.Topic]; ok {
				if _, ok := ps[tp.Partition]; ok {
					out[tp] = m.MemberID
				}
			}
		}
	}
	return out, nil
}

func classicOwners(ctx context.Context, adm *kadm.Client, group string, tps []runner.TP) (map[runner.TP]string, error) {
	described, err := adm.DescribeGroups(ctx, group)
	if err == nil {
		err = described.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("franz: describing group %s: %w", group, err)
	}
	g := described[group]
	switch g.State {
	case "Stable":
	case "Empty", "Dead":
		return map[runner.TP]string{}, nil
	default:
		return nil, fmt.Errorf("franz: group %s is %s: its assignment is not settled", group, g.State)
	}
	out := make(map[runner.TP]string, len(tps))
	for _, m := range g.Members {
		a, ok := m.Assigned.AsConsumer()
		if !ok {
			continue
		}
		for _, t := range a.Topics {
			for _, p := range t.Partitions {
				for _, tp := range tps {
					if tp.Topic == t.Topic && tp.Partition == p {
						out[tp] = m.MemberID
					}
				}
			}
		}
	}
	return out, nil
}

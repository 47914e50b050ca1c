package kafkago

import (
	"context"
	"fmt"

	kafka "github.com/segmentio/kafka-go"

	"github.com/tidemark/tidemark/pkg/runner"
)

// PartitionOwners returns, for each of tps, the member id of the member of
// group that the group coordinator's assignment gives it to; a partition
// no member has is missing from the map. It asks with DescribeGroups (the
// classic protocol, the only one kafka-go speaks), whose assignment is
// settled only while the group is Stable: in any other state it returns an
// error rather than a guess. It implements inbox.Coordinator (pass the
// Source to inbox.Owners). It is safe for concurrent use and does not wait
// for Run; ctx bounds the request.
func (s *Source) PartitionOwners(ctx context.Context, group string, tps []runner.TP) (map[runner.TP]string, error) {
	cl := &kafka.Client{Addr: s.addr, Transport: s.wtr}
	resp, err := cl.DescribeGroups(ctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{group}})
	if err != nil {
		return nil, fmt.Errorf("kafkago: describing group %s: %w", group, err)
	}
	for _, g := range resp.Groups {
		if g.GroupID != group {
			continue
		}
		if g.Error != nil {
			return nil, fmt.Errorf("kafkago: describing group %s: %w", group, g.Error)
		}
		switch g.GroupState {
		case "Stable":
		case "Empty", "Dead":
			return map[runner.TP]string{}, nil
		default:
			return nil, fmt.Errorf("kafkago: group %s is %s: its assignment is not settled", group, g.GroupState)
		}
		out := make(map[runner.TP]string, len(tps))
		for _, m := range g.Members {
			for _, t := range m.MemberAssignments.Topics {
				for _, p := range t.Partitions {
					for _, tp := range tps {
						if tp.Topic == t.Topic && int(tp.Partition) == p {
							out[tp] = m.MemberID
						}
					}
				}
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("kafkago: describing group %s: not in the response", group)
}

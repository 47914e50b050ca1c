// Package sourcetest is the conformance suite every tidemark source adapter
// must pass: the same scenarios, on a real Kafka broker, against each
// adapter (watermill's pubsub/tests pattern). An adapter's test calls Run
// with a Factory that builds its sources and declares its Capabilities:
//
//	func TestConformance(t *testing.T) {
//		sourcetest.Run(t, sourcetest.Factory{
//			Brokers: brokers,
//			New: func(c sourcetest.Config) (runner.Source, error) {
//				return kafkago.New(c.Brokers, c.Group, c.Topics,
//					kafkago.SessionTimeout(c.SessionTimeout), ...)
//			},
//		})
//	}
//
// Each scenario runs members (a runner over a source) in a group of its own,
// on topics it creates and deletes, and judges the adapter from outside: a
// spy between the source and the runner checks every report and hand-over
// against the runner.Source contract (no records of a partition not
// assigned, no hand-over above the runner's budget, no acknowledged commit
// for a partition reported lost, nothing after Close), and a separate
// franz-go client watches the committed offsets the broker holds. Run
// lists the scenarios and what each proves.
//
// What a user must know:
//
//   - The package is untagged so that it compiles with the module; its
//     callers are integration tests (build tag integration) that pass the
//     brokers. A scenario whose broker is missing fails; nothing is skipped.
//   - A capability an adapter lacks is not skipped either: its subtest,
//     named capability/<name>=absent, checks that the adapter falls back as
//     documented (an eager adapter still passes the storm, and really
//     revokes everything on every rebalance).
//   - The scenarios call t.Parallel and take about a minute with two
//     running at once; the members use a 6s session timeout, which the
//     broker's group.min.session.timeout.ms must allow (Kafka's default is
//     exactly 6s).
package sourcetest

// Package status serves a tidemark runner's status page: an HTML page at
// /tidemark that refreshes itself, and the same document as JSON at
// /tidemark.json. Per partition it shows the committed, safe and fetched
// offsets, the lag, whether and why the partition is paused, its buffered
// and in-flight records, the oldest unfinished record (its key, offset,
// age, state, attempts and last error), its lanes in use and its dead
// letters and fenced records; per process the group, the member id, the
// generation and the recent rebalances.
//
// It is a page for people, next to the probes of package shutdown, and it
// reads what Runner.Stats publishes (refreshed every commit interval): no
// JavaScript, no framework. Record keys and handler errors are user bytes;
// the page escapes them (html/template) and shows invalid UTF-8 as U+FFFD.
//
// With Controls the page also pauses and resumes a partition or a whole
// topic (POST /tidemark/pause, /tidemark/resume): an admin surface, off by
// default. Enable it only on an address that operators alone reach (a
// port not exposed by the Service, or localhost behind kubectl
// port-forward): it has no authentication of its own. It refuses
// cross-origin browser requests (net/http's CrossOriginProtection), and
// never changes anything on GET.
//
// Every route, reads included, answers 421 to a Host that is not an IP
// address or a loopback name, so that a page whose DNS name an attacker
// rebinds to this address can neither read the page nor use the
// controls. Reached through a DNS name, pass it to AllowHosts.
package status

package runner_test

import (
	"bytes"
	"context"
	"testing"
	"testing/synctest"

	"github.com/tidemark/tidemark/pkg/runner"
)

// TestHandlerMayKeepARecord: the runner keeps its own copy of every record's
// key, value and headers, so the source may reuse its buffers once Fetched
// returned (as a client does with its fetch buffers), and a handler may keep
// a Record after returning. (The runner kept the source's slices: the
// handler read bytes the source had overwritten.)
func TestHandlerMayKeepARecord(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDriver()
		reused := make(chan struct{})
		kept := make(chan runner.Record, 4)
		r := newRunner(t, d, runner.Handle(topic, func(_ context.Context, rec runner.Record) error {
			<-reused
			kept <- rec
			return nil
		}), runner.Order(runner.Unordered))
		wait := started(t, r)
		sink := d.sink(t)
		ctx := context.Background()
		if err := sink.Assigned(ctx, []runner.Assignment{{TP: tp(0), Start: 0}}); err != nil {
			t.Fatal(err)
		}
		buf := []byte("key-0value-0hdr-0hval-0")
		recs := make([]runner.Record, 4)
		for i := range recs {
			recs[i] = runner.Record{Topic: topic, Offset: int64(i), Key: buf[0:5], Value: buf[5:12],
				Headers: []runner.Header{{Key: "h", Value: buf[17:23]}}}
		}
		recs[3].Key, recs[3].Headers = nil, nil // a nil key stays nil
		if _, err := sink.Fetched(ctx, []runner.Batch{batch(recs)}); err != nil {
			t.Fatal(err)
		}
		copy(buf, bytes.Repeat([]byte("X"), len(buf))) // the source reuses its buffer
		for i := range recs {
			recs[i] = runner.Record{}
		}
		close(reused)
		for range 4 {
			rec := <-kept
			if rec.Offset == 3 {
				if rec.Key != nil || rec.Headers != nil || string(rec.Value) != "value-0" {
					t.Fatalf("record 3 = key %q (nil %v) value %q headers %v, want a nil key, no headers, value-0", rec.Key, rec.Key == nil, rec.Value, rec.Headers)
				}
				continue
			}
			if v, _ := rec.Header("h"); string(rec.Key) != "key-0" || string(rec.Value) != "value-0" || string(v) != "hval-0" {
				t.Fatalf("record %d kept key %q value %q header %q, want key-0 value-0 hval-0: it shares the source's buffer", rec.Offset, rec.Key, rec.Value, v)
			}
		}
		r.Close()
		_ = wait()
	})
}

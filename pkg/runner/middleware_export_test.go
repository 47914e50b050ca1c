package runner

import "context"

// AttemptContextForTest returns ctx carrying attempt n, as the runner's
// execute gives a handler, for tests of middleware that read Attempt.
func AttemptContextForTest(ctx context.Context, n int) context.Context {
	return &attemptCtx{Context: ctx, attempt: n}
}

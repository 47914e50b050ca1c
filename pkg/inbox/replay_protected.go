//go:build !tidemark_unsafe

package inbox

// unsafeBuild is false in every build without the tidemark_unsafe tag: the
// replay protection cannot be switched off (see unsafe_replay.go, the test
// hook that the tag adds).
const unsafeBuild = false

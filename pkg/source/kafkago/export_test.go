package kafkago

// Decode exposes decode to the external tests.
var Decode = decode

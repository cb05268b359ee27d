package idemnats

// DecodeAnswer is decodeAnswer, for the tests.
var DecodeAnswer = decodeAnswer

package idemproxy

// LimitConnections exposes limitConnections to the tests of the listener.
var LimitConnections = limitConnections

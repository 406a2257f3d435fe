// Package e2e holds the end-to-end tests: the real `locks` binary, built from this tree, run
// with every part against real servers, driven only through what users see — RabbitMQ in,
// the REST API, and webhooks out to a real HTTP receiver.
package e2e

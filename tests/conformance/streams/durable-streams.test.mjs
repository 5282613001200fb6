// The Durable Streams conformance suite, whole, against CONFORMANCE_TEST_URL
// (tests/conformance/test_durable_streams.py starts the node and runs this).
// CONFORMANCE_SUBSCRIPTIONS=1 opts in the suite's tests of the reserved
// subscription APIs (protocol §6-7), which PushUp serves on one node.
import { runConformanceTests } from "@durable-streams/server-conformance-tests"

const baseUrl = process.env.CONFORMANCE_TEST_URL
if (!baseUrl) throw new Error("CONFORMANCE_TEST_URL is required")
runConformanceTests({ baseUrl, subscriptions: process.env.CONFORMANCE_SUBSCRIPTIONS === "1" })

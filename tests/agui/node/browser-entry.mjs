// What tests/agui/test_browser.py bundles (esbuild) for Chromium: the published client.
export { HttpAgent } from "@ag-ui/client";

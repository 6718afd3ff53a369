// Talking to the server. The browser is signed in by a cookie the server set when it
// opened this page on a one-time link (HttpOnly: this code never sees it; it goes with
// every same-origin request, EventSource, image and download alike). With --listen a
// browser on another machine signs in once with the access token (signIn below).
// Every change is sent as JSON (an upload as application/octet-stream): the server's
// guard refuses any other kind of write, which is what keeps other sites out.

export class ApiError extends Error {
  constructor(status, data) {
    super(data.error || `request failed (${status})`);
    this.status = status;
    this.errors = data.errors;
    this.signIn = status === 401 ? data.sign_in || "link" : null;
  }
}

export async function api(method, url, body) {
  const write = method !== "GET";
  const upload = body instanceof Blob;
  const headers = write ? { "Content-Type": upload ? "application/octet-stream" : "application/json" } : {};
  const response = await fetch(url, {
    method, headers, credentials: "same-origin",
    body: !write ? undefined : upload ? body : JSON.stringify(body ?? {}),
  });
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

export const signIn = (token) => api("POST", "/api/session", { token });

export const fileUrl = (jobId, path, download = false) =>
  `/api/jobs/${jobId}/files/${path.split("/").map(encodeURIComponent).join("/")}` +
    (download ? "?download=1" : "");
export const eventsUrl = () => "/api/events";

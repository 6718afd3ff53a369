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

// An upload with progress (fetch has no upload progress): the file's bytes as
// application/octet-stream, as the guard expects; onProgress(fraction).
export function upload(url, file, onProgress) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("PUT", url);
    xhr.setRequestHeader("Content-Type", "application/octet-stream");
    xhr.upload.onprogress = (e) => e.lengthComputable && onProgress(e.loaded / e.total);
    xhr.onload = () => {
      let data = {};
      try { data = JSON.parse(xhr.responseText); } catch { /* not JSON */ }
      if (xhr.status >= 200 && xhr.status < 300) resolve(data);
      else reject(new ApiError(xhr.status, data));
    };
    xhr.onerror = () => reject(new ApiError(0, { error: "the upload was cut off" }));
    xhr.send(file);
  });
}

const part = (s) => encodeURIComponent(s);
export const datasetUrl = (name, what = "", file = "") =>
  `/api/datasets/${part(name)}${what ? `/${what}` : ""}${file ? `/${part(file)}` : ""}`;

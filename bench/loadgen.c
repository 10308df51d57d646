/*
 * loadgen: the bench's WebSocket load generator. One thread, one epoll loop, N
 * non-blocking connections, closed loop (each connection waits for its reply before it
 * sends again). bench/run.py compiles it on first use:
 *
 *     gcc -O2 -o bench/build/loadgen bench/loadgen.c -lm
 *
 *     loadgen --url ws://127.0.0.1:8080/proto/websocket?token=T --mode ping|tool|stream|idle
 *             --proto proto|echo --connections N --warmup S --seconds S [--server-pid P]
 *             [--parts N] [--pipeline N] [--batch N] [--connect-concurrency N]
 *
 * --proto proto speaks the full protocol: HELLO handshake first, then
 *   ping:   PING -> PONG
 *   tool:   TOOL_CALL echo -> TOOL_DONE (matching call_id)
 *   stream: MESSAGE_START, MESSAGE_PART x parts, MESSAGE_END, PING (one write), and the
 *           PONG confirms the server processed the burst; `pipeline` bursts in flight per
 *           connection; upstream credit (HELLO reply + FLOW_UPDATE) is respected.
 *   batch:  `batch` PINGs in one write, then wait for all their PONGs (the shape
 *           bench/http_downstream.py uses for SSE and the HTTP stream)
 *   idle:   connect + handshake, print {"event":"ready",...}, hold every connection until
 *           a line (or EOF) arrives on stdin, then report how many were still open.
 * --proto echo talks to a bare echo server: no HELLO, any text frame answers the last one.
 * Server heartbeat PINGs are answered with PONG in every mode.
 *
 * Frames are ~185 bytes, like bench/loadgen.mjs and bench/loadgen_py.py. The server's CPU
 * time is read from /proc/<pid>/stat and this process's from getrusage() at the edges of
 * the measured window. Prints one JSON object (the result) as the last line of stdout.
 * The JSON reader below only finds keys in objects (enough for the server's envelopes).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { M_PING, M_TOOL, M_STREAM, M_IDLE, M_BATCH };
enum { S_TCP, S_UPGRADE, S_HELLO, S_READY, S_CLOSED };
#define PIPE_MAX 16
#define SESSION "0123456789abcdef0123456789abcdef"
#define BIG_CREDIT "1000000000"

typedef struct {
    char *p;
    size_t len, cap;
} buf_t;

typedef struct {
    int fd, idx, state;
    buf_t rb, wb, frag;
    size_t woff;
    int frag_op, want_out;
    uint64_t seq, msgno;
    double sent_at;
    char call_id[48];
    int64_t up_msgs, up_bytes;
    double bursts[PIPE_MAX];
    int bhead, nbursts;
    int awaiting; /* batch: PONGs still to come */
} conn_t;

/* -- config and counters ---------------------------------------------------------------- */
static const char *url = NULL;
static int mode = M_PING, echo = 0, nconn = 1, parts = 20, pipeline = 2, cconc = 64, batch = 50;
static double warmup = 1, seconds = 5;
static long server_pid = 0;
static char host[256], port[16], path[4096];
static struct addrinfo *addr;

static int ep, running = 1, counting = 0, shutting = 0;
static conn_t *conns;
static long replies = 0, messages = 0, errors = 0, closed_early = 0, connected = 0,
            failed = 0, pending_connects = 0, next_connect = 0;
static char first_error[256] = "", last_connect_error[256] = "";
static double *lat = NULL;
static size_t nlat = 0, caplat = 0;
static uint32_t rng = 2463534242u;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static long wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

static void record(double ms) {
    if (nlat == caplat) {
        caplat = caplat ? caplat * 2 : 65536;
        lat = realloc(lat, caplat * sizeof *lat);
    }
    lat[nlat++] = ms;
}

static void note_error(const char *fmt, ...) {
    errors++;
    if (!first_error[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(first_error, sizeof first_error, fmt, ap);
        va_end(ap);
    }
}

static void buf_reserve(buf_t *b, size_t extra) {
    if (b->len + extra > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->len + extra) cap *= 2;
        b->p = realloc(b->p, cap);
        b->cap = cap;
    }
}

static void buf_put(buf_t *b, const void *data, size_t n) {
    buf_reserve(b, n);
    memcpy(b->p + b->len, data, n);
    b->len += n;
}

/* -- sockets ------------------------------------------------------------------------------ */
static void set_events(conn_t *c, int out) {
    if (c->want_out == out) return;
    c->want_out = out;
    struct epoll_event ev = {.events = EPOLLIN | (out ? EPOLLOUT : 0), .data.ptr = c};
    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
}

static void conn_close(conn_t *c, const char *why);

static void flush(conn_t *c) {
    while (c->woff < c->wb.len) {
        ssize_t n = write(c->fd, c->wb.p + c->woff, c->wb.len - c->woff);
        if (n > 0) {
            c->woff += n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            set_events(c, 1);
            return;
        } else {
            conn_close(c, strerror(errno));
            return;
        }
    }
    c->wb.len = c->woff = 0;
    set_events(c, 0);
}

/* Append one masked client frame (FIN set) to the write buffer; flush() sends it. */
static void frame(conn_t *c, int opcode, const char *data, size_t n) {
    unsigned char hdr[14];
    size_t h = 0;
    hdr[h++] = 0x80 | opcode;
    if (n < 126) {
        hdr[h++] = 0x80 | n;
    } else if (n < 65536) {
        hdr[h++] = 0x80 | 126;
        hdr[h++] = n >> 8;
        hdr[h++] = n & 255;
    } else {
        hdr[h++] = 0x80 | 127;
        for (int i = 7; i >= 0; i--) hdr[h++] = ((uint64_t)n >> (8 * i)) & 255;
    }
    rng ^= rng << 13; rng ^= rng >> 17; rng ^= rng << 5;
    unsigned char mask[4] = {rng & 255, (rng >> 8) & 255, (rng >> 16) & 255, rng >> 24};
    memcpy(hdr + h, mask, 4);
    h += 4;
    buf_reserve(&c->wb, h + n);
    memcpy(c->wb.p + c->wb.len, hdr, h);
    unsigned char *out = (unsigned char *)c->wb.p + c->wb.len + h;
    for (size_t i = 0; i < n; i++) out[i] = data[i] ^ mask[i & 3];
    c->wb.len += h + n;
}

/* One envelope as a text frame; returns its encoded length (what flow control charges). */
static size_t envelope(conn_t *c, const char *type, const char *channel, const char *payload) {
    char text[1024];
    c->seq++;
    int n = snprintf(text, sizeof text,
                     "{\"id\":\"c%d-%llu\",\"session\":\"" SESSION "\",\"seq\":\"%llu\",\"ts\":\"%ld\","
                     "\"type\":\"%s\",\"channel\":\"%s\",\"payload\":%s}",
                     c->idx, (unsigned long long)c->seq, (unsigned long long)c->seq, wall_ms(),
                     type, channel, payload);
    frame(c, 1, text, n);
    return n;
}

static void ping_frame(conn_t *c) {
    char payload[64], nonce[31];
    int k = snprintf(nonce, sizeof nonce, "n%llu", (unsigned long long)(c->seq + 1));
    memset(nonce + k, '-', sizeof nonce - 1 - k); /* pad: the frame stays ~185 bytes */
    nonce[sizeof nonce - 1] = 0;
    snprintf(payload, sizeof payload, "{\"nonce\":\"%s\"}", nonce);
    envelope(c, "PING", "SYSTEM", payload);
}

/* -- minimal JSON lookup ------------------------------------------------------------------ */
static const char *skip_ws(const char *s, const char *e) {
    while (s < e && (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')) s++;
    return s;
}

static const char *skip_string(const char *s, const char *e) { /* s at the opening quote */
    for (s++; s < e; s++) {
        if (*s == '\\') s++;
        else if (*s == '"') return s + 1;
    }
    return e;
}

static const char *skip_value(const char *s, const char *e) {
    s = skip_ws(s, e);
    if (s >= e) return e;
    if (*s == '"') return skip_string(s, e);
    if (*s == '{' || *s == '[') {
        int depth = 0;
        while (s < e) {
            if (*s == '"') { s = skip_string(s, e); continue; }
            if (*s == '{' || *s == '[') depth++;
            else if (*s == '}' || *s == ']') { if (--depth == 0) return s + 1; }
            s++;
        }
        return e;
    }
    while (s < e && *s != ',' && *s != '}' && *s != ']') s++;
    return s;
}

/* The value of `key` in the object starting at s (or NULL); *vend is set to its end. */
static const char *json_get(const char *s, const char *e, const char *key, const char **vend) {
    size_t klen = strlen(key);
    s = skip_ws(s, e);
    if (s >= e || *s != '{') return NULL;
    s++;
    while (s < e) {
        s = skip_ws(s, e);
        if (s >= e || *s == '}') return NULL;
        if (*s == ',') { s++; continue; }
        if (*s != '"') return NULL;
        const char *k = s + 1, *kend = skip_string(s, e);
        int match = (size_t)(kend - 1 - k) == klen && memcmp(k, key, klen) == 0;
        s = skip_ws(kend, e);
        if (s >= e || *s != ':') return NULL;
        s = skip_ws(s + 1, e);
        const char *v = s;
        s = skip_value(s, e);
        if (match) { *vend = s; return v; }
    }
    return NULL;
}

/* String (without quotes) or raw value, copied into out. */
static int json_str(const char *obj, const char *e, const char *key, char *out, size_t outn) {
    const char *vend, *v = json_get(obj, e, key, &vend);
    if (!v) { out[0] = 0; return 0; }
    if (*v == '"') { v++; if (vend > v) vend--; }
    size_t n = vend - v < (long)outn - 1 ? (size_t)(vend - v) : outn - 1;
    memcpy(out, v, n);
    out[n] = 0;
    return 1;
}

static int64_t json_int(const char *obj, const char *e, const char *key, int64_t dflt) {
    char tmp[32];
    if (!json_str(obj, e, key, tmp, sizeof tmp) || !tmp[0]) return dflt;
    if (!strcmp(tmp, "false")) return -1;
    return strtoll(tmp, NULL, 10);
}

/* -- protocol --------------------------------------------------------------------------- */
static void send_bursts(conn_t *c) {
    char payload[256], id[48];
    while (running && c->state == S_READY && c->nbursts < pipeline) {
        /* credit check with the sizes this burst will have (ids/seqs vary by a few bytes) */
        int64_t need_msgs = parts + 2, need_bytes = (int64_t)(parts + 2) * 240;
        if (c->up_msgs < need_msgs || c->up_bytes < need_bytes) return; /* wait: FLOW_UPDATE */
        snprintf(id, sizeof id, "m%d-%llu", c->idx, (unsigned long long)++c->msgno);
        size_t bytes = 0;
        snprintf(payload, sizeof payload, "{\"message_id\":\"%s\",\"content_type\":\"text/plain\"}", id);
        bytes += envelope(c, "MESSAGE_START", "USER", payload);
        for (int i = 0; i < parts; i++) {
            snprintf(payload, sizeof payload, "{\"message_id\":\"%s\",\"content\":\" token%d\"}", id, i);
            bytes += envelope(c, "MESSAGE_PART", "USER", payload);
        }
        snprintf(payload, sizeof payload, "{\"message_id\":\"%s\"}", id);
        bytes += envelope(c, "MESSAGE_END", "USER", payload);
        c->up_msgs -= parts + 2;
        c->up_bytes -= bytes;
        ping_frame(c);
        c->bursts[(c->bhead + c->nbursts) % PIPE_MAX] = now_ms();
        c->nbursts++;
    }
    flush(c);
}

static void send_request(conn_t *c) {
    if (!running || c->state != S_READY) return;
    if (mode == M_PING) {
        c->sent_at = now_ms();
        ping_frame(c);
        flush(c);
    } else if (mode == M_TOOL) {
        char payload[160];
        snprintf(c->call_id, sizeof c->call_id, "t%d-%llu", c->idx, (unsigned long long)(c->seq + 1));
        snprintf(payload, sizeof payload,
                 "{\"call_id\":\"%s\",\"tool\":\"echo\",\"params\":{\"message\":\"hello from the bench\"}}",
                 c->call_id);
        c->sent_at = now_ms();
        envelope(c, "TOOL_CALL", "USER", payload);
        flush(c);
    } else if (mode == M_STREAM) {
        send_bursts(c);
    } else if (mode == M_BATCH) {
        c->sent_at = now_ms();
        for (int i = 0; i < batch; i++) ping_frame(c);
        c->awaiting = batch;
        flush(c);
    }
}

static void became_ready(conn_t *c) {
    c->state = S_READY;
    connected++;
    pending_connects--;
}

static void on_message(conn_t *c, const char *m, size_t n) {
    const char *e = m + n, *pend;
    if (echo && c->state == S_READY) {
        if (mode == M_IDLE) return;
        if (counting) { replies++; record(now_ms() - c->sent_at); }
        send_request(c);
        return;
    }
    char type[32];
    if (!json_str(m, e, "type", type, sizeof type)) {
        note_error("frame without a type: %.120s", m);
        return;
    }
    const char *p = json_get(m, e, "payload", &pend);
    if (!p) p = pend = e;
    if (!strcmp(type, "PONG")) {
        if (mode == M_PING) {
            if (counting) { replies++; record(now_ms() - c->sent_at); }
            send_request(c);
        } else if (mode == M_STREAM && c->nbursts) {
            double t = c->bursts[c->bhead];
            c->bhead = (c->bhead + 1) % PIPE_MAX;
            c->nbursts--;
            if (counting) { messages += parts + 2; replies++; record(now_ms() - t); }
            send_bursts(c);
        } else if (mode == M_BATCH && c->awaiting > 0 && --c->awaiting == 0) {
            if (counting) { messages += batch; replies++; record(now_ms() - c->sent_at); }
            send_request(c);
        }
    } else if (!strcmp(type, "TOOL_DONE")) {
        char call[48], status[16];
        json_str(p, pend, "call_id", call, sizeof call);
        if (mode == M_TOOL && !strcmp(call, c->call_id)) {
            json_str(p, pend, "status", status, sizeof status);
            if (strcmp(status, "OK")) note_error("TOOL_DONE %.160s", p);
            if (counting) { replies++; record(now_ms() - c->sent_at); }
            send_request(c);
        }
    } else if (!strcmp(type, "PING")) { /* the server's heartbeat */
        char nonce[128], payload[160];
        json_str(p, pend, "nonce", nonce, sizeof nonce);
        snprintf(payload, sizeof payload, "{\"nonce\":\"%s\"}", nonce);
        envelope(c, "PONG", "SYSTEM", payload);
        flush(c);
    } else if (!strcmp(type, "FLOW_UPDATE")) {
        char channel[16];
        json_str(p, pend, "channel", channel, sizeof channel);
        if (!strcmp(channel, "USER")) {
            c->up_msgs += json_int(p, pend, "add_messages", 0);
            c->up_bytes += json_int(p, pend, "add_bytes", 0);
            if (mode == M_STREAM) send_bursts(c);
        }
    } else if (!strcmp(type, "HELLO") && c->state == S_HELLO) {
        const char *capend, *fcend, *cap = json_get(p, pend, "capabilities", &capend);
        const char *fc = cap ? json_get(cap, capend, "flow_control", &fcend) : NULL;
        if (fc && json_int(fc, fcend, "enabled", 1) != -1) {
            c->up_msgs = json_int(fc, fcend, "initial_credit_messages", 1000);
            c->up_bytes = json_int(fc, fcend, "initial_credit_bytes", 1048576);
        } else {
            c->up_msgs = c->up_bytes = INT64_MAX / 4;
        }
        became_ready(c);
    } else if (!strcmp(type, "ERROR")) {
        char code[64];
        json_str(p, pend, "code", code, sizeof code);
        note_error("ERROR %s: %.160s", code, p);
    }
}

static void on_upgraded(conn_t *c) {
    if (echo) {
        became_ready(c);
        return;
    }
    c->state = S_HELLO;
    envelope(c, "HELLO", "SYSTEM",
             "{\"proto_version\":\"1.1.2\",\"accept_major\":[1],\"accept_events\":[],"
             "\"capabilities\":{\"flow_control\":{\"initial_credit_messages\":" BIG_CREDIT
             ",\"initial_credit_bytes\":" BIG_CREDIT "000}}}");
    flush(c);
}

static void start_connect(int idx);

static void conn_close(conn_t *c, const char *why) {
    if (c->state == S_CLOSED) return;
    int was = c->state;
    c->state = S_CLOSED;
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    if (was == S_READY) {
        connected--;
        if (!shutting) closed_early++;
    } else {
        failed++;
        pending_connects--;
        snprintf(last_connect_error, sizeof last_connect_error, "%s", why);
    }
}

/* Parse every complete frame in the read buffer. */
static void parse_frames(conn_t *c) {
    size_t off = 0;
    unsigned char *b = (unsigned char *)c->rb.p;
    while (c->state != S_CLOSED && c->rb.len - off >= 2) {
        unsigned char *f = b + off;
        size_t avail = c->rb.len - off, h = 2;
        uint64_t n = f[1] & 127;
        int masked = f[1] & 128, op = f[0] & 15, fin = f[0] & 128;
        if (n == 126) {
            if (avail < 4) break;
            n = (f[2] << 8) | f[3];
            h = 4;
        } else if (n == 127) {
            if (avail < 10) break;
            n = 0;
            for (int i = 0; i < 8; i++) n = (n << 8) | f[2 + i];
            h = 10;
        }
        if (masked) h += 4;
        if (avail < h + n) break;
        char *data = (char *)f + h;
        if (masked)
            for (uint64_t i = 0; i < n; i++) data[i] ^= f[h - 4 + (i & 3)];
        off += h + n;
        if (op == 8) { /* close: answer it and drop the connection */
            frame(c, 8, data, n >= 2 ? 2 : 0);
            flush(c);
            char why[64];
            snprintf(why, sizeof why, "closed by the server (code %d)", n >= 2 ? (f[h] << 8) | f[h + 1] : 1005);
            if (c->state == S_READY && !shutting) note_error("%s", why);
            conn_close(c, why);
        } else if (op == 9) {
            frame(c, 10, data, n);
            flush(c);
        } else if (op == 1 || op == 2 || op == 0) {
            if (op != 0 && fin) {
                on_message(c, data, n);
            } else {
                if (op != 0) { c->frag.len = 0; c->frag_op = op; }
                buf_put(&c->frag, data, n);
                if (fin) { on_message(c, c->frag.p, c->frag.len); c->frag.len = 0; }
            }
        }
    }
    if (c->state == S_CLOSED) return;
    if (off) {
        memmove(c->rb.p, c->rb.p + off, c->rb.len - off);
        c->rb.len -= off;
    }
}

static void on_readable(conn_t *c) {
    for (;;) {
        buf_reserve(&c->rb, 65536);
        ssize_t n = read(c->fd, c->rb.p + c->rb.len, c->rb.cap - c->rb.len);
        if (n > 0) {
            c->rb.len += n;
            if ((size_t)n < 65536 / 2) break; /* likely drained; epoll says if not */
            continue;
        }
        if (n == 0) { conn_close(c, "EOF from the server"); return; }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        conn_close(c, strerror(errno));
        return;
    }
    if (c->state == S_UPGRADE) {
        char *end = memmem(c->rb.p, c->rb.len, "\r\n\r\n", 4);
        if (!end) return;
        if (c->rb.len < 12 || memcmp(c->rb.p + 9, "101", 3) != 0) {
            char why[200];
            char *eol = memchr(c->rb.p, '\r', c->rb.len);
            snprintf(why, sizeof why, "upgrade refused: %.*s", (int)(eol ? eol - c->rb.p : 40), c->rb.p);
            conn_close(c, why);
            return;
        }
        size_t hl = end + 4 - c->rb.p;
        memmove(c->rb.p, c->rb.p + hl, c->rb.len - hl);
        c->rb.len -= hl;
        on_upgraded(c);
    }
    if (c->state == S_HELLO || c->state == S_READY) parse_frames(c);
}

static void on_connected(conn_t *c) { /* TCP connect finished */
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err) { conn_close(c, strerror(err)); return; }
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->state = S_UPGRADE;
    char req[4608];
    int n = snprintf(req, sizeof req,
                     "GET %s HTTP/1.1\r\nHost: %s:%s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
                     path, host, port);
    buf_put(&c->wb, req, n);
    flush(c);
}

static void start_connect(int idx) {
    conn_t *c = &conns[idx];
    memset(c, 0, sizeof *c);
    c->idx = idx;
    c->state = S_TCP;
    pending_connects++;
    c->fd = socket(addr->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0) {
        failed++;
        pending_connects--;
        snprintf(last_connect_error, sizeof last_connect_error, "socket: %s", strerror(errno));
        c->state = S_CLOSED;
        return;
    }
    c->want_out = 1;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
    epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
    if (connect(c->fd, addr->ai_addr, addr->ai_addrlen) < 0 && errno != EINPROGRESS)
        conn_close(c, strerror(errno));
}

static void on_event(conn_t *c, uint32_t events) {
    if (c->state == S_CLOSED) return;
    if (c->state == S_TCP) {
        if (events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) on_connected(c);
        return;
    }
    if (events & EPOLLOUT) flush(c);
    if (c->state != S_CLOSED && (events & (EPOLLIN | EPOLLERR | EPOLLHUP))) on_readable(c);
}

/* -- measurement -------------------------------------------------------------------------- */
static double server_cpu(void) {
    if (!server_pid) return -1;
    char fn[64], s[2048];
    snprintf(fn, sizeof fn, "/proc/%ld/stat", server_pid);
    FILE *f = fopen(fn, "r");
    if (!f) return -1;
    size_t n = fread(s, 1, sizeof s - 1, f);
    fclose(f);
    s[n] = 0;
    char *p = strrchr(s, ')');
    if (!p) return -1;
    unsigned long long ut = 0, st = 0;
    /* after ") ": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2) return -1;
    return (double)(ut + st) / sysconf(_SC_CLK_TCK);
}

static double own_cpu(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void json_escape(const char *s, char *out, size_t outn) {
    size_t o = 0;
    for (; *s && o + 7 < outn; s++) {
        unsigned char ch = *s;
        if (ch == '"' || ch == '\\') { out[o++] = '\\'; out[o++] = ch; }
        else if (ch < 0x20) o += snprintf(out + o, outn - o, "\\u%04x", ch);
        else out[o++] = ch;
    }
    out[o] = 0;
}

static void jnum(FILE *f, const char *key, double v, int ok) {
    if (ok) fprintf(f, ",\"%s\":%.3f", key, v);
    else fprintf(f, ",\"%s\":null", key);
}

static const char *mode_name(void) {
    return mode == M_PING ? "ping" : mode == M_TOOL ? "tool" : mode == M_STREAM ? "stream"
         : mode == M_BATCH ? "batch" : "idle";
}

static void print_base(double connect_s) {
    char err[600];
    json_escape(last_connect_error, err, sizeof err);
    printf("\"mode\":\"%s\",\"proto\":\"%s\",\"generator\":\"c\",\"connections\":%d,\"connected\":%ld,"
           "\"connect_failed\":%ld,\"connect_error\":%s%s%s,\"connect_seconds\":%.3f,\"connect_per_s\":%.1f",
           mode_name(), echo ? "echo" : "proto", nconn, connected, failed,
           err[0] ? "\"" : "", err[0] ? err : "null", err[0] ? "\"" : "", connect_s,
           connect_s > 0 ? connected / connect_s : 0.0);
}

static void print_tail(void) {
    char err[600];
    json_escape(first_error, err, sizeof err);
    printf(",\"errors\":%ld,\"first_error\":%s%s%s,\"closed_early\":%ld}\n", errors,
           err[0] ? "\"" : "", err[0] ? err : "null", err[0] ? "\"" : "", closed_early);
    fflush(stdout);
}

static void loop_once(int timeout_ms) {
    struct epoll_event evs[512];
    int n = epoll_wait(ep, evs, 512, timeout_ms);
    for (int i = 0; i < n; i++) {
        if (evs[i].data.ptr == NULL) continue; /* stdin */
        on_event(evs[i].data.ptr, evs[i].events);
    }
    /* keep `cconc` connects in flight */
    while (next_connect < nconn && pending_connects < cconc) start_connect(next_connect++);
}

static void usage(void) {
    fprintf(stderr, "usage: loadgen --url ws://HOST:PORT/PATH --mode ping|tool|stream|batch|idle "
                    "--proto proto|echo --connections N --warmup S --seconds S [--server-pid P] "
                    "[--parts N] [--pipeline N] [--batch N] [--connect-concurrency N]\n");
    exit(2);
}

int main(int argc, char **argv) {
    static struct option opts[] = {
        {"url", 1, 0, 'u'}, {"mode", 1, 0, 'm'}, {"proto", 1, 0, 'p'}, {"connections", 1, 0, 'c'},
        {"warmup", 1, 0, 'w'}, {"seconds", 1, 0, 's'}, {"server-pid", 1, 0, 'P'},
        {"parts", 1, 0, 'n'}, {"pipeline", 1, 0, 'l'}, {"connect-concurrency", 1, 0, 'C'},
        {"batch", 1, 0, 'b'}, {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'u': url = optarg; break;
        case 'm':
            mode = !strcmp(optarg, "ping") ? M_PING : !strcmp(optarg, "tool") ? M_TOOL
                 : !strcmp(optarg, "stream") ? M_STREAM : !strcmp(optarg, "idle") ? M_IDLE
                 : !strcmp(optarg, "batch") ? M_BATCH : -1;
            if (mode < 0) usage();
            break;
        case 'p': echo = !strcmp(optarg, "echo"); break;
        case 'c': nconn = atoi(optarg); break;
        case 'w': warmup = atof(optarg); break;
        case 's': seconds = atof(optarg); break;
        case 'P': server_pid = atol(optarg); break;
        case 'n': parts = atoi(optarg); break;
        case 'l': pipeline = atoi(optarg); break;
        case 'C': cconc = atoi(optarg); break;
        case 'b': batch = atoi(optarg) > 0 ? atoi(optarg) : 1; break;
        default: usage();
        }
    }
    if (!url || strncmp(url, "ws://", 5) || nconn < 1) usage();
    if (pipeline < 1) pipeline = 1;
    if (pipeline > PIPE_MAX) pipeline = PIPE_MAX;
    const char *hp = url + 5, *slash = strchr(hp, '/');
    snprintf(path, sizeof path, "%s", slash ? slash : "/");
    size_t hl = slash ? (size_t)(slash - hp) : strlen(hp);
    const char *colon = memchr(hp, ':', hl);
    snprintf(host, sizeof host, "%.*s", (int)(colon ? colon - hp : (long)hl), hp);
    snprintf(port, sizeof port, "%.*s", colon ? (int)(hp + hl - colon - 1) : 2, colon ? colon + 1 : "80");
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM};
    if (getaddrinfo(host, port, &hints, &addr)) { fprintf(stderr, "cannot resolve %s\n", host); return 2; }

    struct rlimit rl;
    if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    ep = epoll_create1(EPOLL_CLOEXEC);
    conns = calloc(nconn, sizeof *conns);

    /* connect (and handshake) everything, `cconc` at a time */
    double t0 = now_ms();
    while (connected + failed < nconn && now_ms() - t0 < 120000) loop_once(100);
    double connect_s = (now_ms() - t0) / 1000;

    if (mode == M_IDLE) {
        printf("{\"event\":\"ready\",");
        print_base(connect_s);
        printf("}\n");
        fflush(stdout);
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
        epoll_ctl(ep, EPOLL_CTL_ADD, 0, &ev);
        for (;;) {
            struct epoll_event evs[512];
            int n = epoll_wait(ep, evs, 512, 1000), stop = 0;
            for (int i = 0; i < n; i++) {
                if (evs[i].data.ptr == NULL) stop = 1;
                else on_event(evs[i].data.ptr, evs[i].events);
            }
            if (stop) break;
        }
        long held = connected;
        shutting = 1;
        printf("{");
        print_base(connect_s);
        printf(",\"held\":%ld", held);
        print_tail();
        return 0;
    }
    if (!connected) {
        printf("{");
        print_base(connect_s);
        printf(",\"error\":\"no connection could be opened\"");
        print_tail();
        return 1;
    }
    for (int i = 0; i < nconn; i++)
        if (conns[i].state == S_READY) send_request(&conns[i]);
    double start = now_ms(), measure_at = start + warmup * 1000, end_at = measure_at + seconds * 1000;
    double w0 = 0, cpu0 = 0, srv0 = -1;
    while (connected > 0) {
        double t = now_ms();
        if (!counting && t >= measure_at && t < end_at) {
            counting = 1;
            w0 = t;
            cpu0 = own_cpu();
            srv0 = server_cpu();
        }
        if (t >= end_at) break;
        double next = counting ? end_at : measure_at;
        int timeout = (int)(next - t) + 1;
        loop_once(timeout > 0 ? timeout : 0);
    }
    double w1 = now_ms(), cpu = own_cpu() - cpu0, srv1 = server_cpu();
    counting = 0;
    running = 0;
    double window = (w1 - w0) / 1000;
    if (!w0) window = 0;
    qsort(lat, nlat, sizeof *lat, cmp_double);
#define PCT(q) (nlat ? lat[(size_t)((q) * nlat) < nlat ? (size_t)((q) * nlat) : nlat - 1] : 0)
    long work = (mode == M_STREAM || mode == M_BATCH) ? messages : replies;
    double srv = (srv0 >= 0 && srv1 >= 0) ? srv1 - srv0 : -1;
    printf("{");
    print_base(connect_s);
    printf(",\"window_s\":%.3f,\"replies\":%ld,\"rt_per_s\":%.1f", window, replies,
           window > 0 ? replies / window : 0.0);
    if (mode == M_STREAM)
        printf(",\"messages\":%ld,\"messages_per_s\":%.1f,\"parts\":%d,\"pipeline\":%d", messages,
               window > 0 ? messages / window : 0.0, parts, pipeline);
    if (mode == M_BATCH)
        printf(",\"messages\":%ld,\"messages_per_s\":%.1f,\"batch\":%d", messages,
               window > 0 ? messages / window : 0.0, batch);
    jnum(stdout, "p50_ms", PCT(0.5), nlat > 0);
    jnum(stdout, "p90_ms", PCT(0.9), nlat > 0);
    jnum(stdout, "p99_ms", PCT(0.99), nlat > 0);
    jnum(stdout, "max_ms", nlat ? lat[nlat - 1] : 0, nlat > 0);
    jnum(stdout, "server_cpu_s", srv, srv >= 0);
    jnum(stdout, "server_cpu_pct", window > 0 ? 100 * srv / window : 0, srv >= 0 && window > 0);
    jnum(stdout, "server_us_per_op", work ? srv * 1e6 / work : 0, srv >= 0 && work > 0);
    jnum(stdout, "gen_cpu_pct", window > 0 ? 100 * cpu / window : 0, window > 0);
    jnum(stdout, "gen_us_per_op", work ? cpu * 1e6 / work : 0, work > 0);
    shutting = 1;
    print_tail();
    return 0;
}

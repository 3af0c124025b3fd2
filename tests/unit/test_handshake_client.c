/* The handshake client (src/net/handshake.c, kvp__hs_client) against a
 * scripted server on 127.0.0.1: a handshake the server closes midway is
 * tried again (the server's handshake gate displaces the least recent one
 * when too many are in progress), at most three times in all, and a server
 * that went away leaves the loss as the answer. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/handshake.h"
#include "test.h"

typedef enum { ACT_CLOSE, ACT_BUSY } act_t;

typedef struct {
    int lfd;
    uint16_t port;
    act_t acts[8]; /* what the server does with its i-th connection */
    size_t n_acts;
    bool close_listener_after; /* after the last scripted act: stop listening */
    atomic_int accepted;
    atomic_bool stop;
    pthread_t thread;
} fake_t;

/* Reads the client's whole hello (its 24 bytes), or gives up after 2 s. */
static void read_hello(int fd)
{
    uint8_t buf[KVP_HS_HELLO_V2];
    size_t got = 0;
    while (got < sizeof buf) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 2000) <= 0)
            return;
        ssize_t k = recv(fd, buf + got, sizeof buf - got, 0);
        if (k <= 0)
            return;
        got += (size_t)k;
    }
}

static void *fake_main(void *arg)
{
    fake_t *f = arg;
    while (!atomic_load(&f->stop)) {
        struct pollfd p = {f->lfd, POLLIN, 0};
        if (f->lfd < 0 || poll(&p, 1, 20) <= 0)
            continue;
        int fd = accept(f->lfd, NULL, NULL);
        if (fd < 0)
            continue;
        int i = atomic_fetch_add(&f->accepted, 1);
        act_t a = (size_t)i < f->n_acts ? f->acts[i] : ACT_CLOSE;
        read_hello(fd);
        if (a == ACT_BUSY) {
            uint8_t ch[KVP_HS_CHALLENGE], nonce[KVP_HS_NONCE] = {0};
            size_t n = kvp__hs_encode_challenge(ch, KVP_ERR_BUSY, 0, 0, nonce);
            (void)!send(fd, ch, n, MSG_NOSIGNAL);
        }
        close(fd);
        if (f->close_listener_after && (size_t)i + 1 == f->n_acts) {
            close(f->lfd);
            f->lfd = -1;
        }
    }
    return NULL;
}

static void fake_start(fake_t *f)
{
    f->lfd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT(f->lfd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    ASSERT_EQ(bind(f->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    ASSERT_EQ(listen(f->lfd, 16), 0);
    ASSERT_EQ(getsockname(f->lfd, (struct sockaddr *)&sa, &sl), 0);
    f->port = ntohs(sa.sin_port);
    atomic_init(&f->accepted, 0);
    atomic_init(&f->stop, false);
    ASSERT_EQ(pthread_create(&f->thread, NULL, fake_main, f), 0);
}

static void fake_stop(fake_t *f)
{
    atomic_store(&f->stop, true);
    pthread_join(f->thread, NULL);
    if (f->lfd >= 0)
        close(f->lfd);
}

/* Closed once, then refused with BUSY: the second attempt is the one that
 * answers. */
TEST(test_hs_client_handshake_closed_midway_is_tried_again)
{
    fake_t f = {.acts = {ACT_CLOSE, ACT_BUSY}, .n_acts = 2};
    fake_start(&f);
    kvp__hs_result_t res;
    ASSERT_EQ(kvp__hs_client("127.0.0.1", f.port, NULL, KVP_HS_WANT_TCP, 5000, &res), KVP_ERR_BUSY);
    ASSERT_EQ(atomic_load(&f.accepted), 2);
    ASSERT_EQ(res.fd, -1);
    fake_stop(&f);
}

/* Closed every time: three attempts, then the loss. */
TEST(test_hs_client_closed_every_time_three_attempts_then_conn_lost)
{
    fake_t f = {.acts = {ACT_CLOSE, ACT_CLOSE, ACT_CLOSE, ACT_CLOSE, ACT_CLOSE}, .n_acts = 5};
    fake_start(&f);
    kvp__hs_result_t res;
    ASSERT_EQ(kvp__hs_client("127.0.0.1", f.port, NULL, KVP_HS_WANT_TCP, 5000, &res), KVP_ERR_CONN_LOST);
    usleep(100000); /* a fourth connect would have come by now */
    ASSERT_EQ(atomic_load(&f.accepted), 3);
    fake_stop(&f);
}

/* Closed, then the server is gone (its port refuses): the loss is the
 * answer, not the refusal of the try after it. */
TEST(test_hs_client_server_gone_after_closing_reports_conn_lost)
{
    fake_t f = {.acts = {ACT_CLOSE}, .n_acts = 1, .close_listener_after = true};
    fake_start(&f);
    kvp__hs_result_t res;
    ASSERT_EQ(kvp__hs_client("127.0.0.1", f.port, NULL, KVP_HS_WANT_TCP, 5000, &res), KVP_ERR_CONN_LOST);
    ASSERT_EQ(atomic_load(&f.accepted), 1);
    fake_stop(&f);
}

TEST_LIST(T(test_hs_client_handshake_closed_midway_is_tried_again),
          T(test_hs_client_closed_every_time_three_attempts_then_conn_lost),
          T(test_hs_client_server_gone_after_closing_reports_conn_lost))

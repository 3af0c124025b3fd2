/* kvp_status_str / kvp_status_name, built from the one list in status.h. */
#include "kvpool/status.h"

const char *kvp_status_str(kvp_status_t status)
{
    switch (status) {
#define KVP__STATUS_MSG(name, value, msg) \
    case name:                            \
        return msg;
        KVP_STATUS_LIST(KVP__STATUS_MSG)
#undef KVP__STATUS_MSG
    }
    return "unknown status";
}

const char *kvp_status_name(kvp_status_t status)
{
    switch (status) {
#define KVP__STATUS_NAME(name, value, msg) \
    case name:                             \
        return #name;
        KVP_STATUS_LIST(KVP__STATUS_NAME)
#undef KVP__STATUS_NAME
    }
    return "KVP_UNKNOWN_STATUS";
}

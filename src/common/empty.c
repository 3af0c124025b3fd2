/* Stands in for the sources of a layer that has none yet, so every layer library links. */
typedef int kvp__empty_layer_t;

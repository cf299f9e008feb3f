"""TorchLens backend for TensorFlow 2 (eager) and Keras 3 on TensorFlow.

An eager op callback records every TensorFlow op a forward executes; Keras
layer calls give module paths and passes; tf.function code runs eagerly for
the capture. Importing this package never imports TensorFlow or Keras.
"""

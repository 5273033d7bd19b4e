#!/bin/bash
ecko "fjord"
